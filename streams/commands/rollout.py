"""``specstream rollout start|status|pause|resume|abort``: canary rollouts of a model (see streams/ops/rollout.py).

    specstream rollout start --candidate candidate.yaml --steps 1,5,20,50,100 --hold 10m
    specstream rollout status
    specstream rollout pause|resume|abort [--reason TEXT]

``start`` owns the candidate workers it starts: at 100 % it stays in the foreground until the rollout is ended
(``rollout abort`` or Ctrl-C: all traffic back to stable, then its workers drain and stop). It exits 0 when every
step held, 1 when it rolled back or was aborted before 100 % or Kafka kept failing past ``ops.rollout.kafka_outage_s``
(a broker restarting meanwhile is ridden through), 2 on bad input (an unreadable candidate configuration names its
key). ``status`` says which processes serve each pool and how to stop them.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

from schemas.events import ENGINE_WORKER_KIND, RolloutState, ServiceAnnouncement
from streams.commands.common import describe, format_duration, say
from streams.config import ConfigError, Settings, load_settings

EXIT_BAD_INPUT = 2
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")


def add_commands(commands: Any) -> None:
    p = commands.add_parser("rollout", help="canary rollout of a candidate pool: start, status, pause, resume, abort")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    start = actions.add_parser("start", help="start the candidate pool and move traffic to it step by step")
    start.add_argument("--candidate", type=Path, required=True, help="the candidate pool's configuration (YAML)")
    start.add_argument("--model", help="the model name both pools serve (default: engine.model)")
    start.add_argument("--steps", default="1,5,20,50,100", help="percentages of traffic, ascending (1,5,20,50,100)")
    start.add_argument("--hold", default="10m", help="how long each step must hold its gates (10m, 30s)")
    start.add_argument("--workers", type=int, default=1,
                       help="candidate workers to start here; 0: the pool runs elsewhere (a Deployment)")
    start.add_argument("--ready-timeout", default="5m", help="the candidate pool must be ready within this")
    start.add_argument("--interval", default="1s", help="how often the gates are checked")
    start.add_argument("--eval-gate", metavar="COMMAND", help="run at the end of each step; non-zero exit fails it "
                       "(e.g. 'specstream eval replay ...')")
    start.add_argument("--max-error-rate-increase", type=float, default=0.05)
    start.add_argument("--latency-ratio", type=float, default=1.5, help="candidate p99 TTFT/ITL at most stable's x this")
    start.add_argument("--latency-slack", default="250ms",
                       help="added to that limit (a duration): with few answers, a pool's p99 is its slowest one")
    start.add_argument("--min-samples", type=int, default=5, help="answers per pool before latencies are compared")
    start.add_argument("--log-dir", type=Path, help="each candidate worker's output in DIR/<worker-id>.log")
    for name, text in (("status", "every model's rollout state"), ("pause", "freeze the current step"),
                       ("resume", "continue a paused rollout"), ("abort", "all traffic back to stable, now")):
        action = actions.add_parser(name, help=text)
        action.add_argument("--model", help="the model (default: engine.model)")
        if name == "status":
            action.add_argument("--json", action="store_true")
        else:
            action.add_argument("--reason", default=f"{name} by the operator")
    p.set_defaults(handler=cmd_rollout)


def duration_s(text: str, flag: str) -> float:
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"{flag}: expected a duration such as 30s, 10m or 1h, got {text!r}")
    scale = {"ms": 0.001, "s": 1, None: 1, "m": 60, "h": 3600}[match.group(2)]
    return float(match.group(1)) * scale


def steps_of(text: str) -> list[float]:
    try:
        steps = [float(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"--steps: expected percentages such as 1,5,20,50,100, got {text!r}") from None
    if not steps or any(not 0 < s <= 100 for s in steps) or steps != sorted(set(steps)):
        raise ValueError(f"--steps: percentages must rise, each in (0, 100], got {text!r}")
    return steps


def cmd_rollout(args: argparse.Namespace, settings: Settings) -> int:
    from aiokafka.errors import KafkaError

    from streams.ops.rollout_store import RolloutError

    model = args.model or settings.engine.model
    try:
        if args.action == "start":
            return _start(args, settings, model)
        if args.action == "status":
            return _status(args, settings)
        return _transition(args, settings, model)
    except (ValueError, ConfigError) as error:
        say(f"rollout: {error}")
        return EXIT_BAD_INPUT if not isinstance(error, RolloutError) else 1
    except (KafkaError, OSError) as error:
        say(f"rollout: error: {describe(error)}")
        return 1


def _start(args: argparse.Namespace, settings: Settings, model: str) -> int:
    from streams.ops.rollout import Rollout, RolloutPlan
    from streams.ops.rollout_gates import Gates

    candidate = load_settings(str(args.candidate))  # a bad candidate configuration stops here, naming its key
    if args.workers < 0:
        raise ValueError(f"--workers must not be negative, got {args.workers}")
    plan = RolloutPlan(
        candidate_config=args.candidate, model=model, steps=steps_of(args.steps),
        hold_s=duration_s(args.hold, "--hold"), workers=args.workers,
        ready_timeout_s=duration_s(args.ready_timeout, "--ready-timeout"),
        interval_s=duration_s(args.interval, "--interval"), eval_gate=args.eval_gate, log_dir=args.log_dir,
        drain_timeout_s=candidate.worker.drain_timeout_s,
        gates=Gates(max_error_rate_increase=args.max_error_rate_increase, latency_ratio=args.latency_ratio,
                    latency_slack_s=duration_s(args.latency_slack, "--latency-slack"), min_samples=args.min_samples))
    rollout = Rollout(settings, plan, say)
    asyncio.run(rollout.run())
    return 0 if rollout.completed else 1


def _status(args: argparse.Namespace, settings: Settings) -> int:
    from streams.ops.rollout_store import read_states

    states = asyncio.run(read_states(settings.kafka, settings.catalog))
    if args.json:
        print(json.dumps([s.model_dump(mode="json") for s in states.values()], indent=2))
        return 0
    if not states:
        say(f"no rollout on {settings.catalog.rollouts.name}")
    for s in states.values():
        steps = ",".join(f"{p:g}" for p in s.steps)
        print(f"{s.model}: {s.state}, {s.percent:g} % to the candidate ({s.candidate}, topics {s.candidate_prefix}.*), "
              f"step {s.step + 1} of [{steps}], {format_duration(time.time() - s.at)} ago: {s.reason}")
        for line in asyncio.run(_pool_lines(settings, s)):
            print(f"  {line}")
    return 0


async def _pool_lines(settings: Settings, state: RolloutState) -> list[str]:
    """Who serves each pool of the rollout's model, and how each is stopped."""
    from schemas.topics import TopicCatalog

    stale_after_s = settings.edge.ready_heartbeats * settings.worker.heartbeat_s
    ended = state.state in ("rolled_back", "aborted")
    if state.controller_pid is None:
        lines = []
    elif state.local_workers and not ended:
        lines = [f"controller: `rollout start` pid {state.controller_pid} on {state.controller_host}, owning the "
                 f"{state.local_workers} candidate worker(s) it started: `specstream rollout abort` (or Ctrl-C there) "
                 "puts all traffic on stable and drains them"]
    else:
        lines = [f"controller: `rollout start` pid {state.controller_pid} on {state.controller_host}"
                 + ("" if state.local_workers else "; the candidate pool runs elsewhere (scale its Deployment)")]
    for pool, catalog in (("candidate", TopicCatalog(state.candidate_prefix)), ("stable", settings.catalog)):
        # The candidate prefix is the rollout's own; stable's services topic also lists other models' workers.
        model = state.model if pool == "stable" else None
        workers = await _serving_workers(settings, catalog.services.name, model, stale_after_s)
        if not workers:
            lines.append(f"{pool} pool: no engine worker announced")
        for w in workers:
            how = ("SIGTERM to it drains it (it outlived its rollout)" if pool == "candidate" and ended
                   else "drained by `rollout abort`" if pool == "candidate" and state.local_workers
                   else "SIGTERM to it drains it")
            lines.append(f"{pool} pool: {w.service_id} {w.state} on {w.host or '?'}/{w.pid or '?'}: {how}")
    return lines


async def _serving_workers(settings: Settings, topic: str, model: str | None,
                           stale_after_s: float) -> list[ServiceAnnouncement]:
    """The engine workers announced on ``topic`` (serving ``model``, if given), neither stopped nor stale."""
    from streams.kafka import clients
    from streams.kafka.announcements import read_announcements

    if topic not in await clients.list_topics(settings.kafka):
        return []
    announcements, _ = await read_announcements(settings.kafka, topic)
    now = time.time()
    return sorted((a for a in announcements.values() if a.kind == ENGINE_WORKER_KIND and a.state != "stopped"
                   and (model is None or model in a.models) and now - a.at <= stale_after_s),
                  key=lambda a: a.service_id)


def _transition(args: argparse.Namespace, settings: Settings, model: str) -> int:
    from streams.ops.rollout_store import transition

    state = asyncio.run(transition(settings.kafka, settings.catalog, model, args.action, args.reason))
    say(f"rollout of {model}: {state.state}, {state.percent:g} % to the candidate")
    return 0
