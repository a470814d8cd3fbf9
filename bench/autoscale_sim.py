"""Lag-driven autoscaling against fixed replicas, simulated on a synthetic day (diurnal curve plus bursts).

    python -m bench.autoscale_sim                     # the figures in docs/performance.md
    python -m bench.autoscale_sim --hours 2 --out sim.json

The model and its assumptions are in :mod:`streams.ops.simulation`; the decision is the real one
(:class:`streams.ops.scaling.Autoscaler`). Worker defaults describe a GPU worker of an 8B model as
`specstream plan --model llama-3-8b --device H100-80GB` sizes it (32 requests of 256 tokens decoding together,
8 s each) with a 60 s cold start, and the measured 3 s group pause of a rebalance (docs/operations.md).
Reports, per strategy: requests, share answered within the SLO, SLO goodput (good requests per second), p50/p99
latency, worker-minutes, most replicas and scale events.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict

from streams.ops.scaling import ScalePolicy
from streams.ops.simulation import SimulationResult, Simulation, TraceShape, WorkerModel, arrivals


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.autoscale_sim", description=__doc__.split("\n\n")[0])
    p.add_argument("--hours", type=float, default=24.0, help="length of the trace (one diurnal period)")
    p.add_argument("--trough", type=float, default=1.0, help="requests/s at night")
    p.add_argument("--peak", type=float, default=24.0, help="requests/s at the daily peak")
    p.add_argument("--bursts", type=int, default=8, help="bursts on top of the curve")
    p.add_argument("--burst-requests", type=int, default=600, help="requests per burst (over 30 s)")
    p.add_argument("--slots", type=int, default=32, help="requests a worker decodes together")
    p.add_argument("--service-s", type=float, default=8.0, help="one request's time in a full batch")
    p.add_argument("--start-s", type=float, default=60.0, help="cold start of a worker")
    p.add_argument("--rebalance-s", type=float, default=3.0, help="group pause of one rebalance")
    p.add_argument("--slo-s", type=float, default=30.0, help="end-to-end latency a request must meet")
    p.add_argument("--partitions", type=int, default=12, help="request partitions (most consumers)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", help="write the outcomes as JSON")
    args = p.parse_args(argv)

    model = WorkerModel(args.slots, args.service_s, args.start_s, args.rebalance_s)
    duration = args.hours * 3600
    shape = TraceShape(duration, duration, args.trough, args.peak, args.bursts, args.burst_requests, seed=args.seed)
    started = time.monotonic()
    times = arrivals(shape)
    peak_need = math.ceil(args.peak / model.capacity_rps)
    mean_need = math.ceil((args.peak + args.trough) / 2 / model.capacity_rps)
    print(f"trace: {len(times)} requests over {args.hours:g} h, {args.trough:g}-{args.peak:g} req/s + "
          f"{args.bursts} bursts of {args.burst_requests}; a worker serves {model.capacity_rps:.1f} req/s",
          file=sys.stderr)
    runs: list[tuple[str, dict]] = [
        (f"fixed {peak_need} (peak)", {"fixed": peak_need}),
        (f"fixed {peak_need + 2} (peak + 2)", {"fixed": peak_need + 2}),
        (f"fixed {mean_need} (mean)", {"fixed": mean_need}),
        ("autoscale local (poll 2 s, down 60 s)", {"policy": _policy(args, model, 60), "poll_s": 2.0}),
        ("autoscale KEDA (poll 15 s, down 300 s)", {"policy": _policy(args, model, 300), "poll_s": 15.0}),
    ]
    outcomes: list[SimulationResult] = []
    for name, kwargs in runs:
        poll = kwargs.pop("poll_s", 15.0)
        sim = Simulation(model, args.slo_s, args.partitions, poll_s=poll)
        outcomes.append(sim.run(name, times, **kwargs))
        print(f"  {name}: done ({time.monotonic() - started:.0f} s)", file=sys.stderr)
    print(_table(outcomes, duration))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "outcomes": [asdict(o) for o in outcomes]}, f, indent=2)
    return 0


def _policy(args: argparse.Namespace, model: WorkerModel, down_s: float) -> ScalePolicy:
    # One worker's worth of load: the requests it decodes at once.
    return ScalePolicy(min_replicas=1, max_replicas=args.partitions, lag_threshold=model.slots,
                       scale_down_window_s=down_s)


def _table(outcomes: list[SimulationResult], duration_s: float) -> str:
    lines = ["| strategy | requests | within SLO | SLO goodput (req/s) | p50 (s) | p99 (s) | worker-minutes | "
             "most replicas | scale events |", "|---|---|---|---|---|---|---|---|---|"]
    for o in outcomes:
        lines.append(f"| {o.name} | {o.requests} | {100 * o.good_share:.2f} % | {o.good / duration_s:.2f} | "
                     f"{o.p50_s:.1f} | {o.p99_s:.1f} | {o.worker_minutes:.0f} | {o.max_replicas} | {o.scale_events} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
