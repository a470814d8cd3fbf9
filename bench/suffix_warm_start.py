"""How long a worker drafting by suffix decoding takes to start warm from the completions topic (issue 41: under
10 s for 100k completions).

    python -m bench.suffix_warm_start                      # 100,000 records, the default model
    python -m bench.suffix_warm_start --records 20000 --profile 30   # and the 30 costliest functions

Publishes --records completion records (seeded JSON answers: an order's fields, the keys repeating, the values
not; from another worker, three tenants) to a fresh completions topic on the local broker, then
starts an engine worker in this process (`engine.speculation.method: suffix`) and times two spans: its start
(`EngineWorker.start`: the model loaded, the consumers running) and the warm-up (from the start's beginning until
every record is read and every usable answer is in the engine's index). Kafka must be running (the local broker
is started if it is not).
"""
from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import pstats
import random
import sys
import time
import uuid
from pathlib import Path

from bench.result_files import default_out

CARRIERS = ("DHL", "UPS", "FedEx", "La Poste", "Royal Mail", "PostNL", "GLS")
STATUSES = ("shipped", "delivered", "held at customs", "returned", "awaiting pickup")
TENANTS = ("acme", "globex", "initech")


def answer(rng: random.Random, i: int) -> str:
    """One extraction's JSON answer: the structure repeats, the values do not."""
    fields = {"order": f"A-{rng.randrange(10**6):06d}", "status": rng.choice(STATUSES),
              "carrier": rng.choice(CARRIERS), "items": rng.randrange(1, 9),
              "total_eur": round(rng.uniform(3, 900), 2), "customer": f"customer {i % 977}"}
    if rng.random() < 0.5:
        fields["notes"] = rng.choice(["leave at the door", "call first", "fragile", "gift wrap"])
    return json.dumps(fields)


def records(n: int, model: str, seed: int = 0) -> list:
    from tests.completion_records import record  # the record a worker writes (streams.worker.completions_log)

    rng = random.Random(seed)
    return [record(f"r{i}", "Extract the order as JSON.", answer(rng, i), model=model,
                   tenant=TENANTS[i % len(TENANTS)], worker="another-worker") for i in range(n)]


async def run(args: argparse.Namespace, bootstrap: str) -> dict:
    from engine.config import EngineConfig
    from streams.config import KafkaSettings, Settings, WorkerSettings
    from streams.kafka import clients
    from streams.worker import EngineWorker
    from tests.completion_records import publish

    prefix = f"bench-warm-{uuid.uuid4().hex[:8]}"
    settings = Settings(kafka=KafkaSettings(bootstrap_servers=bootstrap, topic_prefix=prefix, manage_local=False),
                        engine=EngineConfig(model=args.model, speculation={"method": "suffix"}),
                        worker=WorkerSettings(id=f"bench-{uuid.uuid4().hex[:6]}"))
    t0 = time.perf_counter()
    await publish(bootstrap, settings.catalog.completions.name, records(args.records, args.model))
    print(f"published {args.records} records in {time.perf_counter() - t0:.1f} s", flush=True)
    gc.collect()  # the records built here are gone before the worker starts (a worker never held them)

    worker = EngineWorker(settings)
    profiler = cProfile.Profile() if args.profile else None
    if profiler:
        profiler.enable()
    started = time.perf_counter()
    await worker.start()
    start_s = time.perf_counter() - started
    feed = worker.suffix_feed
    assert feed is not None, "the worker does not draft by suffix decoding from the completions topic"
    try:
        while feed.read < args.records:
            assert time.perf_counter() - started < args.timeout, f"read {feed.read} of {args.records}"
            await asyncio.sleep(0.05)
        await feed.drained()
        warm_s = time.perf_counter() - started
        if profiler:
            profiler.disable()
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(args.profile)
        index = worker.engine.proposer.outputs  # type: ignore[union-attr]
        kept = {t: index.num_sequences_of(f"tenant:{t}") for t in TENANTS}
    finally:
        await worker.stop()
        # A hundred thousand records a run: a broker keeps every topic's partitions in its heap.
        await clients.delete_topics(bootstrap, [t for t in await clients.list_topics(bootstrap)
                                                if t.startswith(prefix + ".")])
    print(f"start {start_s:.1f} s; warm (start included) {warm_s:.1f} s: {feed.read} read, {feed.learned} learned, "
          f"kept per tenant {kept}", flush=True)
    return {"records": args.records, "start_s": start_s, "warm_s": warm_s, "read": feed.read, "learned": feed.learned,
            "kept": kept, "topic_prefix": prefix}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="print the N costliest functions")
    parser.add_argument("--out", default=None, help="the raw result file (default bench/results/<date>-...)")
    args = parser.parse_args(argv)
    from infra.kafka.broker import single_node, start
    from infra.kafka.cli import SINGLE_PORT_ENV
    from infra.kafka.paths import env_port

    spec = single_node(port=env_port(SINGLE_PORT_ENV, 9092))
    start(spec)
    result = asyncio.run(run(args, spec.bootstrap_servers))
    out = Path(args.out or default_out("suffix-warm-start"))
    command = "python -m bench.suffix_warm_start " + " ".join(sys.argv[1:] if argv is None else argv)
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    out.write_text(json.dumps({"command": command.strip(), "date": date, **result}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
