"""Chaos soak: every service kind under a mixed load while a seeded schedule kills, pauses and poisons them; then
a ledger of what every client got, which must balance.

    python -m bench.chaos                          # 20 minutes, seed 1 (the issue's run)
    python -m bench.chaos --minutes 3              # the short version CI runs
    python -m bench.chaos --seed 7 --out bench/results/<date>-chaos.json --logs /tmp/chaos-logs

What runs: the three-node Kafka cluster (replication 3, min ISR 2; started if it is not running, stopped again
afterwards), Redis for the edges' shared limits, and bench/chaos/deployment.py's services (two edges, two engine
workers, parser, rag, tool runner, batch assembler). Load (each flow in its own module): websocket chats with
cancellations, SSE chats, raw Kafka requests, document uploads into a vector store, python-tool and file_search
chats, one Batch API job, LoRA adapter loads and unloads, one rollout to a candidate pool and back.
Faults (bench/chaos/schedule.py): kill -9 and restart of every service kind, an edge stopped with open sockets,
the broker leading most request partitions killed, a broker frozen (SIGSTOP) past the session timeouts, Redis
killed and restarted, poison on every input topic, an edge's reply topic deleted.
Exit status 1 when any ledger row or check fails.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.chaos import checks, schedule  # noqa: E402
from bench.chaos.batch_flow import BatchFlow  # noqa: E402
from bench.chaos.chat_flows import EdgeFaults, RawKafkaFlow, SseChatFlow, WsChatFlow  # noqa: E402
from bench.chaos.deployment import Deployment  # noqa: E402
from bench.chaos.document_flow import DocumentFlow  # noqa: E402
from bench.chaos.faults import FaultRunner  # noqa: E402
from bench.chaos.ledger import FlowContext, Tally, passed, say, table  # noqa: E402
from bench.chaos.ops_flows import AdapterFlow, RolloutFlow  # noqa: E402
from bench.chaos.tool_flows import FileSearchFlow, PythonToolFlow, intent_ledger  # noqa: E402


def _parser() -> argparse.ArgumentParser:
    from infra.kafka.paths import env_port
    from infra.kafka.spec import DEFAULT_CLUSTER_BASE_PORT

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=20.0, help="length of the load (default 20)")
    parser.add_argument("--seed", type=int, default=1, help="the fault schedule's seed (default 1)")
    parser.add_argument("--kills-per-kind", type=int, help="kill -9s of each service kind (default 2; 1 under 10 min)")
    parser.add_argument("--broker-down-s", type=float, default=20.0, help="seconds a killed broker stays down")
    parser.add_argument("--broker-pause-s", type=float, default=15.0,
                        help="seconds a broker stays frozen (past the 6 s broker and consumer session timeouts)")
    parser.add_argument("--batch-lines", type=int, help="lines of the Batch API job (default 200; 60 under 10 min)")
    parser.add_argument("--cluster-port", type=int, default=env_port("SPECSTREAM_KAFKA_CLUSTER_PORT",
                                                                    DEFAULT_CLUSTER_BASE_PORT))
    parser.add_argument("--logs", type=Path, help="keep every service's log here (default: a temporary folder)")
    parser.add_argument("--out", type=Path, help="write the ledger and the schedule as JSON here")
    return parser


async def _guarded(name: str, coro: Any, failures: list[str]) -> None:
    """A flow that raises is a finding, not the end of the run: the others go on."""
    try:
        await coro
    except Exception as error:  # noqa: BLE001
        failures.append(f"{name}: {type(error).__name__}: {error}")
        say(f"flow {name} failed: {type(error).__name__}: {error}")


async def _watch(deployment: Deployment, runner: FaultRunner, stop_at: float, deaths: list[str]) -> None:
    """RSS every 5 s; a service that exits without a fault is a finding, and started again so the run goes on."""
    while time.monotonic() < stop_at:
        deployment.sample()
        for name, service in deployment.services.items():
            if name not in runner.busy and (problem := service.exited_unexpectedly()) is not None:
                deaths.append(problem.splitlines()[0])
                say(f"unexpected exit: {problem}")
                service.incarnations[-1].ended = time.monotonic()
                service.start()
        await asyncio.sleep(5.0)


async def _drive(args: argparse.Namespace, deployment: Deployment, cluster: Any,
                 faults: list[schedule.Fault]) -> tuple[list[Tally], list[checks.Check], list[str]]:
    short = args.minutes < 10
    ctx: FlowContext = deployment.context()
    edge_faults = EdgeFaults()
    runner = FaultRunner(deployment, cluster, edge_faults)
    ws, sse, raw = WsChatFlow(2, edge_faults), SseChatFlow(edge_faults), RawKafkaFlow()
    python, grounded = PythonToolFlow(edge_faults, pause_s=4.0), FileSearchFlow(edge_faults, pause_s=4.0)
    documents = DocumentFlow(interval_s=15.0 if short else 30.0)
    batch = BatchFlow(lines=args.batch_lines or (60 if short else 200))
    adapters, rollout = AdapterFlow(cycles=1 if short else 2), RolloutFlow(start_after_s=20.0 if short else 60.0)
    await grounded.prepare(ctx)
    failures: list[str] = []
    deaths: list[str] = []
    started = time.monotonic()
    stop_at = started + args.minutes * 60
    say(f"load for {args.minutes:g} min, {len(faults)} faults (seed {args.seed})")
    flows = {"ws": ws, "sse": sse, "raw": raw, "python": python, "file_search": grounded, "documents": documents,
             "batch": batch, "adapters": adapters, "rollout": rollout}
    await asyncio.gather(
        *(_guarded(name, flow.run(ctx, stop_at), failures) for name, flow in flows.items()),
        _guarded("faults", runner.run(faults, started), failures), _watch(deployment, runner, stop_at, deaths))
    say("load over; settling")
    tallies = [ws.settle(), sse.settle(), raw.settle(), python.settle(), grounded.settle(), await intent_ledger(ctx)]
    for flow in (documents, batch, adapters, rollout):
        tallies.append(await flow.settle(ctx, 600.0))
    found = [await checks.dead_letters(deployment, runner.injected), await checks.lag(deployment, 180.0),
             checks.memory(deployment, args.minutes * 60), checks.running(deployment),
             checks.Check("no service exited on its own", not deaths, "; ".join(deaths) or "none"),
             checks.Check("every flow ran to its end", not failures, "; ".join(failures) or "all")]
    return tallies, found, [f"{f.describe()}  (began {at - runner.started_wall:.1f}s in)" for at, f in runner.done]


def main(argv: list[str] | None = None) -> int:
    from infra.kafka.broker import start, status, stop, three_nodes

    args = _parser().parse_args(argv)
    # aiokafka logs every failed connection to a downed broker at ERROR: the faults are scheduled, the ledger judges.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    seconds = args.minutes * 60
    kills = args.kills_per_kind or (1 if args.minutes < 10 else 2)
    faults = schedule.build(args.seed, seconds, kills_per_kind=kills, broker_down_s=args.broker_down_s,
                            broker_pause_s=args.broker_pause_s, poison_rounds=1 if args.minutes < 10 else 2)
    say("schedule:\n" + "\n".join(f.describe() for f in faults))
    cluster = three_nodes(base_port=args.cluster_port)
    started_cluster = not status(cluster).pids
    start(cluster)
    with contextlib.ExitStack() as cleanup:
        logs = args.logs or Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="specstream-chaos-")))
        logs.mkdir(parents=True, exist_ok=True)
        deployment = Deployment(cluster.bootstrap_servers, logs)
        try:
            deployment.start()
            tallies, found, applied = asyncio.run(_drive(args, deployment, cluster, faults))
        finally:
            deployment.stop()
            if started_cluster:
                stop(cluster)
    print(table(tallies, found))
    ok = passed(tallies, found)
    if args.out:
        args.out.write_text(json.dumps({
            "minutes": args.minutes, "seed": args.seed, "passed": ok, "faults": applied,
            "ledger": [{k: v for k, v in vars(t).items()} | {"ok": t.ok} for t in tallies],
            "checks": [vars(c) for c in found]}, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
