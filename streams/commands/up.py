"""``specstream up``: start what is missing (local Kafka, topics, an engine worker, a document parser, the rag
service, a tool runner, the edge and the batch assembler beside it); Ctrl-C stops all.

The worker and the edge it starts are supervised (:mod:`streams.supervisor`):
one that dies is restarted with backoff; one that crash-loops makes ``up`` say
so and stop. Ctrl-C or SIGTERM stops the edge (no new requests), then the
worker (it drains), then the broker ``up`` started.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import signal
import time
from collections.abc import Iterator
from typing import Any

from streams.commands.common import console, describe, out, say
from streams.commands.kafka import KafkaHandle, ensure_kafka
from streams.commands.topics import create_topics
from streams.config import ConfigError, Settings
from streams.supervisor import CrashLoop, RestartPolicy, Supervisor, service_argv

READY_TIMEOUT_S = 900.0  # first start converts the model; later starts take seconds


def add_commands(commands: Any) -> None:
    up = commands.add_parser("up", help="start what is missing: Kafka, topics, engine worker, parser, rag, edge")
    up.add_argument("--no-edge", action="store_true", help="do not start an edge")
    up.add_argument("--no-worker", action="store_true", help="do not start an engine worker")
    up.add_argument("--no-parser", action="store_true", help="do not start a document parser")
    up.add_argument("--no-tool-runner", action="store_true", help="do not start a tool runner (server-side tools)")
    up.add_argument("--no-rag", action="store_true", help="do not start the indexer/retriever (`specstream rag`)")
    up.set_defaults(handler=cmd_up)


def _http_status(url: str) -> int | None:
    import httpx

    try:
        return httpx.get(url, timeout=2.0).status_code
    except httpx.HTTPError:
        return None


@contextlib.contextmanager
def _stop_signals_interrupt() -> Iterator[None]:
    """SIGINT (Ctrl-C) and SIGTERM both mean "stop everything cleanly".

    SIGINT is set explicitly because a process started in the background by a
    non-interactive shell inherits it ignored.
    """
    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def cmd_up(args: argparse.Namespace, settings: Settings) -> int:
    from aiokafka.errors import KafkaError

    from infra.kafka.errors import KafkaInfraError

    supervisor = Supervisor(policy=RestartPolicy(**settings.ops.restart.model_dump()), say=say)
    kafka: KafkaHandle | None = None
    with _stop_signals_interrupt():
        try:
            kafka = ensure_kafka(settings)
            _create_topics(settings)
            _start_services(args, settings, supervisor)
            while True:
                supervisor.check()
                time.sleep(0.5)
        except KeyboardInterrupt:
            say("stopping ...")
            return 0
        except CrashLoop as error:
            say(f"up: {error}; stopping the rest")
            return 1
        except (KafkaInfraError, KafkaError, ConfigError, OSError, TimeoutError) as error:
            say(f"up: error: {describe(error)}")
            return 1
        finally:
            # Edge first (no new requests), then the worker (drains), then the broker we started.
            supervisor.stop()
            if kafka is not None:
                kafka.stop_if_started_here()


def _create_topics(settings: Settings) -> None:
    with console.status("topics: creating ..."):
        results = create_topics(settings)
    created = [r.name for r in results if r.created]
    say(f"topics: {', '.join(created) + ' created' if created else 'all present'}")


def _start_services(args: argparse.Namespace, settings: Settings, supervisor: Supervisor) -> None:
    """Start the worker and the edge (unless told not to, or already running); return once the edge is ready."""
    from streams.commands.keys import curl_auth, prepare_up

    edge = settings.edge
    base = f"http://{edge.host}:{edge.port}"
    edge_running = _http_status(f"{base}/healthz") == 200
    key_file = None if args.no_edge else prepare_up(settings, say)  # the local API key, or a loud warning
    if args.no_worker:
        say("worker: not started (--no-worker)")
    else:
        supervisor.start("worker", service_argv(args.config, "worker"))
    if not args.no_parser:
        supervisor.start("parser", service_argv(args.config, "parser"))
    _start_tool_runner(args, settings, supervisor)
    if not args.no_rag:
        supervisor.start("rag", service_argv(args.config, "rag"))
    if args.no_edge:
        say("edge: not started (--no-edge)")
        say("running; Ctrl-C stops")
        return
    if edge_running:
        say(f"edge: already running on {base}")
    else:
        supervisor.start("edge", service_argv(args.config, "edge"))
        # Beside the edge: it writes batches' output files into the same files store (files.dir).
        supervisor.start("batch-assembler", [*service_argv(args.config, "batch"), "assembler"])
    _wait_ready(base, supervisor)
    _print_urls(settings, base, curl_auth(key_file))


def _start_tool_runner(args: argparse.Namespace, settings: Settings, supervisor: Supervisor) -> None:
    """Server-side tools (docs/tools.md) run in a tool runner; it needs bubblewrap for its sandbox."""
    import shutil

    if args.no_tool_runner or not settings.tools.registry:
        say("tool-runner: not started" + (" (--no-tool-runner)" if args.no_tool_runner else " (tools.registry is empty)"))
    elif shutil.which(settings.tools.sandbox.bwrap) is None:
        say(f"tool-runner: not started: {settings.tools.sandbox.bwrap} not found (apt-get install bubblewrap); "
            "server-side tool calls answer no_result")
    else:
        supervisor.start("tool-runner", service_argv(args.config, "tool-runner"))


def _wait_ready(base: str, supervisor: Supervisor) -> None:
    """Until the edge's /readyz says a worker announced itself; children that die meanwhile are restarted."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    with console.status("waiting for the engine worker to load the model and announce itself ..."):
        while time.monotonic() < deadline:
            if _http_status(f"{base}/readyz") == 200:
                return
            supervisor.check()
            time.sleep(1.0)
    raise TimeoutError(f"{base}/readyz not ready after {READY_TIMEOUT_S:.0f}s")


def _print_urls(settings: Settings, base: str, auth: str = "") -> None:
    ws = base.replace("http://", "ws://", 1)
    model = settings.engine.model
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "What is Kafka?"}],
                       "max_tokens": 64, "stream": True})
    out.print("\n[bold green]specstream is up[/bold green]")
    out.print(f"""  edge HTTP        {base}   (/healthz, /readyz)
  chat page        {base}/
  websocket        {ws}/v1/ws
  OpenAI base URL  {base}/v1   (model: {model})

  curl -N {base}/v1/chat/completions {auth}-H 'content-type: application/json' \\
    -d '{body}'

Ctrl-C stops everything.
""", markup=False, soft_wrap=True)
