"""`specstream bench`: drive a running specstream (or the engine in-process) and report what clients see.

    specstream bench --backend openai --concurrency 4 --num-requests 64 --out result.json
    specstream bench --backend kafka --request-rate 2 --duration 60 --slo ttft=500ms,e2e=5s
    specstream bench --sweep-rates 1,2,4 --num-requests 64 --out sweep.json        # plot: latency vs rate
    specstream bench --compare-inprocess --concurrency 4 --num-requests 32          # bus overhead
    specstream bench compare A.json B.json

Exit status: 0 when the run finished (errors are figures, see the table), 1
when no request completed or, with ``--strict``, when any failed; 2 for bad
arguments or configuration.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from streams.bench import arrivals
from streams.bench.backends import BACKENDS, BackendOptions, make_backend
from streams.bench.backends.base import FailedBackend, start_or_fail
from streams.bench.record import RequestRecord
from streams.bench.report import (
    bus_overhead, compare_table, load_result, overhead_table, ratios, result_file, run_result, summary_table, write_json,
)
from streams.bench.runner import LoadSpec, ProgressSink, LoadRun, merge_outcomes, run_load, warm_up
from streams.bench.stats import parse_slo
from streams.bench.workload import (
    SETS, BenchRequest, LengthSpec, BenchSampling, from_dataset, load_dataset, synthetic, take,
)


DEFAULT_CONCURRENCY = 8


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _nonneg_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, not {value}")
    return value


def _rate(text: str) -> float:
    try:
        return arrivals.parse_rate(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="specstream bench", description=__doc__.split("\n\n")[0],
        epilog="Compare two result files: specstream bench compare A.json B.json",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    g = p.add_argument_group("service")
    g.add_argument("--backend", choices=BACKENDS, default="openai",
                   help="openai: edge HTTP+SSE; ws: edge websocket; kafka: the request topic directly; inprocess: the engine here")
    g.add_argument("--base-url", default=None, help="edge URL (default: from the config's edge host and port)")
    g.add_argument("--endpoint", choices=("auto", "chat", "completions"), default="auto",
                   help="openai backend: auto sends chats to /v1/chat/completions and prompts to /v1/completions")
    g.add_argument("--ws-connections", type=_positive_int, default=4, help="ws backend: connections to spread requests over")
    g.add_argument("--bootstrap-servers", default=None, help="kafka backend (default: from the config)")
    g.add_argument("--topic-prefix", default=None, help="kafka backend (default: from the config)")
    g.add_argument("--model", default=None, help="model name (default: the config's engine.model)")
    g.add_argument("--api-key", default=None,
                   help="sent as a Bearer token (default: $SPECSTREAM_API_KEY, else $OPENAI_API_KEY)")
    g.add_argument("--config", default=None, help="specstream.yaml to read defaults (and the in-process engine) from")
    g.add_argument("--timeout", type=float, default=120.0, help="seconds a request may take before it counts as a timeout")

    g = p.add_argument_group("load")
    shape = g.add_mutually_exclusive_group()
    shape.add_argument("--concurrency", type=_positive_int, default=None,
                       help="closed loop: this many clients (the default, 8, when no rate is given)")
    shape.add_argument("--request-rate", type=_rate, default=None,
                       help="open loop: requests per second with gamma arrivals ('inf' sends all at once)")
    shape.add_argument("--sweep-rates", default=None, help="open loop at each of these rates, e.g. 1,2,4")
    g.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of inter-arrival gaps: 1 Poisson, <1 burstier")
    g.add_argument("--max-concurrency", type=_positive_int, default=None, help="open loop: cap on requests in flight")
    size = g.add_mutually_exclusive_group()
    size.add_argument("--num-requests", type=_positive_int, default=None, help="measured requests (default 64)")
    size.add_argument("--duration", type=float, default=None, help="send for this many seconds instead")
    g.add_argument("--warmup", type=_nonneg_int, default=2, help="requests sent first and left out of every figure")
    g.add_argument("--compare-inprocess", action="store_true",
                   help="run the workload against the service and against the engine in this process, and report the bus overhead")
    g.add_argument("--rounds", type=_positive_int, default=2,
                   help="--compare-inprocess: split the workload into this many rounds, alternating service and "
                        "in-process as ABBA..., so drift in the machine's load hits both alike")

    g = p.add_argument_group("workload")
    g.add_argument("--workload", choices=SETS, default="mixed", help="built-in synthetic set")
    g.add_argument("--dataset", default=None, help="JSONL of prompts ({'prompt'} / {'messages'} / ShareGPT {'conversations'})")
    g.add_argument("--no-shuffle", action="store_true", help="dataset: keep the file's order")
    g.add_argument("--input-len", type=_positive_int, default=None, help="approximate prompt tokens of built-in sets")
    g.add_argument("--input-len-jitter", type=float, default=0.0, help="prompt length varies uniformly by this fraction")
    g.add_argument("--output-len", type=_positive_int, default=64, help="max_tokens of each request")
    g.add_argument("--output-len-jitter", type=float, default=0.0, help="max_tokens varies uniformly by this fraction")
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=_nonneg_int, default=0)
    g.add_argument("--speculation", choices=("default", "on", "off"), default="default",
                   help="per-request speculative decoding: the server's default, forced on or off")
    g.add_argument("--seed", type=int, default=0, help="fixes prompts, order, arrival times and sampling seeds")

    g = p.add_argument_group("report")
    g.add_argument("--slo", default=None, help="goodput SLO, e.g. ttft=500ms,e2e=5s (metrics: ttft, tpot, itl, e2e)")
    g.add_argument("--out", default=None, help="result JSON file")
    g.add_argument("--plot", default=None, help="PNG file (default: --out with .png; 'none' to skip)")
    g.add_argument("--no-detail", action="store_true", help="leave per-request records out of the JSON")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g.add_argument("--strict", action="store_true", help="exit 1 when any request failed")
    return p


def build_compare_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specstream bench compare", description="Two result files side by side, with B/A ratios.")
    p.add_argument("a", help="result JSON A (the baseline)")
    p.add_argument("b", help="result JSON B")
    p.add_argument("--json", action="store_true", help="print the ratios as JSON instead of tables")
    return p


# --- progress ----------------------------------------------------------------------------------------------------


class RichSink(ProgressSink):
    def __init__(self, console: Any) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("[green]ok {task.fields[ok]}[/green] [red]err {task.fields[err]}[/red]"), TimeElapsedColumn(),
            console=console,
        )
        self._task: Any = None
        self._ok = self._err = 0

    def __enter__(self) -> "RichSink":
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def phase(self, name: str, total: int | None) -> None:
        if self._task is not None:
            self.progress.update(self._task, visible=self.progress.tasks[self._task].description != "warmup")
        self._ok = self._err = 0
        self._task = self.progress.add_task(name, total=total, ok=0, err=0)

    def done(self, record: RequestRecord) -> None:
        if record.ok:
            self._ok += 1
        else:
            self._err += 1
        self.progress.update(self._task, advance=1, ok=self._ok, err=self._err)


class _NullContext:
    def __enter__(self) -> "_NullContext":
        return self

    def __exit__(self, *exc: object) -> None:
        pass


# --- the run -----------------------------------------------------------------------------------------------------


def _config_errors() -> tuple[type[Exception], ...]:
    try:
        from streams.config import ConfigError
    except ImportError:
        return ()
    return (ConfigError,)


def _settings(path: str | None) -> Any:
    try:
        from streams.config import load_settings
    except ImportError:
        return None
    return load_settings(path)


def _backend_options(args: argparse.Namespace, settings: Any) -> BackendOptions:
    kafka = getattr(settings, "kafka", None)
    edge = getattr(settings, "edge", None)
    engine = getattr(settings, "engine", None)
    base_url = args.base_url
    if base_url is None:
        host = getattr(edge, "host", "127.0.0.1")
        host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        base_url = f"http://{host}:{getattr(edge, 'port', 8000)}"
    engine_config = engine if args.compare_inprocess or args.backend == "inprocess" else None
    return BackendOptions(
        model=args.model or getattr(engine, "model", None) or BackendOptions.model,
        base_url=base_url, endpoint=args.endpoint, ws_connections=args.ws_connections,
        bootstrap_servers=args.bootstrap_servers or getattr(kafka, "bootstrap_servers", BackendOptions.bootstrap_servers),
        topic_prefix=args.topic_prefix or getattr(kafka, "topic_prefix", BackendOptions.topic_prefix),
        kafka=kafka,
        api_key=args.api_key or os.environ.get("SPECSTREAM_API_KEY") or os.environ.get("OPENAI_API_KEY"),
        engine_config=engine_config,
    )


def _request_source(args: argparse.Namespace, sampling: BenchSampling, lengths: LengthSpec, seed: int) -> Any:
    if args.dataset:
        return from_dataset(_DATASET_CACHE[args.dataset], lengths, seed, sampling, shuffle=not args.no_shuffle,
                            name=Path(args.dataset).stem)
    return synthetic(args.workload, lengths, seed, sampling)


_DATASET_CACHE: dict[str, list[dict[str, Any]]] = {}


async def _run_backend(
    name: str, options: BackendOptions, loads: list[LoadSpec], args: argparse.Namespace, sampling: BenchSampling,
    lengths: LengthSpec, slo: dict[str, float], sink: ProgressSink, console: Any,
) -> list[dict[str, Any]]:
    backend = _make_backend(name, options, args)
    results = []
    tag = f"bench-{uuid.uuid4().hex[:8]}"
    if name == "inprocess":
        console.print("[dim]loading the engine in this process...[/dim]")
    backend = await start_or_fail(backend)
    if isinstance(backend, FailedBackend):
        console.print(f"[red]{backend.error}[/red]")
    try:
        for i, load in enumerate(loads):
            warm = take(_request_source(args, sampling, lengths, args.seed + 1_000_003), load.warmup) if i == 0 else []
            label = f"{name} {_load_label(load)}"
            outcome: LoadRun = await run_load(
                backend, _request_source(args, sampling, lengths, args.seed), load,
                warmup_requests=warm, sink=sink, label=label, tag=f"{tag}-{i}",
            )
            results.append(run_result(outcome, slo, backend.describe(), detail=not args.no_detail))
            stray = getattr(backend, "stray_events", 0)
            if stray:
                results[-1]["errors"]["stray_events"] = stray
    finally:
        await backend.close()
    return results


def _make_backend(name: str, options: BackendOptions, args: argparse.Namespace) -> Any:
    if name == "kafka":
        from streams.bench.backends.kafka import KafkaBackend

        return KafkaBackend(options, timeout_s=args.timeout)
    if name == "inprocess":
        from streams.bench.backends.inprocess import InProcessBackend

        return InProcessBackend(options, timeout_s=args.timeout)
    return make_backend(name, options)


def _round_parts(args: argparse.Namespace, load: LoadSpec, sampling: BenchSampling, lengths: LengthSpec,
                 rounds: int) -> list[tuple[LoadSpec, list[BenchRequest] | None, int]]:
    """(load, requests or None for a duration round, round number) per round; both backends get the same ones."""
    if load.num_requests is not None:
        full = take(_request_source(args, sampling, lengths, args.seed), load.num_requests)
        rounds = min(rounds, len(full))
        size, extra = divmod(len(full), rounds)
        parts, start = [], 0
        for r in range(rounds):
            end = start + size + (1 if r < extra else 0)
            parts.append((replace(load, num_requests=end - start), full[start:end], r))
            start = end
        return parts
    assert load.duration_s is not None
    return [(replace(load, duration_s=load.duration_s / rounds), None, r) for r in range(rounds)]


def _round_source(part: tuple[LoadSpec, list[BenchRequest] | None, int], args: argparse.Namespace,
                  sampling: BenchSampling, lengths: LengthSpec) -> Iterator[BenchRequest]:
    load, requests, r = part
    if requests is not None:
        return iter(requests)
    # Duration rounds: an endless source of their own, indices kept apart so requests pair up across backends.
    return (replace(q, index=r * 1_000_000 + q.index) for q in _request_source(args, sampling, lengths, args.seed + r))


async def _run_compare(
    options: BackendOptions, loads: list[LoadSpec], args: argparse.Namespace, sampling: BenchSampling,
    lengths: LengthSpec, slo: dict[str, float], sink: ProgressSink, console: Any,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Service and in-process, both started at once, measured in alternating rounds (ABBA...)."""
    service = _make_backend(args.backend, options, args)
    inprocess = _make_backend("inprocess", options, args)
    console.print("[dim]loading the engine in this process...[/dim]")
    service_runs, inprocess_runs, overheads = [], [], []
    tag = f"bench-{uuid.uuid4().hex[:8]}"
    service = await start_or_fail(service)
    inprocess = await start_or_fail(inprocess)
    for backend in (service, inprocess):
        if isinstance(backend, FailedBackend):
            console.print(f"[red]{backend.error}[/red]")
    try:
        warm = take(_request_source(args, sampling, lengths, args.seed + 1_000_003), loads[0].warmup)
        for backend in (service, inprocess):
            await warm_up(backend, warm, loads[0], sink=sink, tag=f"{tag}-{backend.name}")
        for i, load in enumerate(loads):
            outcomes: dict[str, list[LoadRun]] = {service.name: [], inprocess.name: []}
            parts = _round_parts(args, load, sampling, lengths, args.rounds)
            for part in parts:
                order = (service, inprocess) if part[2] % 2 == 0 else (inprocess, service)
                for backend in order:
                    label = f"{backend.name} {_load_label(load)} round {part[2] + 1}/{len(parts)}"
                    outcomes[backend.name].append(await run_load(
                        backend, _round_source(part, args, sampling, lengths), part[0], sink=sink, label=label,
                        tag=f"{tag}-{i}-{part[2]}-{backend.name}",
                    ))
            merged = {name: merge_outcomes(f"{name} {_load_label(load)}", outs, load) for name, outs in outcomes.items()}
            results = {name: run_result(m, slo, b.describe(), detail=not args.no_detail)
                       for (name, m), b in zip(merged.items(), (service, inprocess))}
            service_runs.append(results[service.name])
            inprocess_runs.append(results[inprocess.name])
            overheads.append(bus_overhead(results[service.name], results[inprocess.name],
                                          merged[service.name].records, merged[inprocess.name].records, rounds=len(parts)))
    finally:
        await asyncio.gather(service.close(), inprocess.close(), return_exceptions=True)
    return service_runs + inprocess_runs, overheads


def _load_label(load: LoadSpec) -> str:
    if load.rate is None:
        return f"c={load.concurrency}"
    rate = "inf" if math.isinf(load.rate) else f"{load.rate:g}/s"
    return rate + (f" c<={load.max_concurrency}" if load.max_concurrency else "")


async def _bench(args: argparse.Namespace, argv: list[str]) -> int:
    from rich.console import Console

    console = Console(stderr=True)
    out_console = Console()
    try:
        slo = parse_slo(args.slo)
        lengths = LengthSpec(args.output_len, args.output_len_jitter, args.input_len, args.input_len_jitter)
        if args.dataset:
            _DATASET_CACHE[args.dataset] = load_dataset(args.dataset)
        settings = _settings(args.config)
        num = args.num_requests if args.num_requests is not None or args.duration is not None else 64
        common = dict(burstiness=args.burstiness, max_concurrency=args.max_concurrency, num_requests=num,
                      duration_s=args.duration, warmup=args.warmup, timeout_s=args.timeout, seed=args.seed)
        if args.sweep_rates:
            loads = [LoadSpec(rate=r, **common) for r in arrivals.parse_rates(args.sweep_rates)]
        elif args.request_rate is not None:
            loads = [LoadSpec(rate=args.request_rate, **common)]
        else:
            loads = [LoadSpec(concurrency=args.concurrency or DEFAULT_CONCURRENCY, **common)]
        if args.compare_inprocess and args.backend == "inprocess":
            raise ValueError("--compare-inprocess compares a service backend (openai, ws, kafka) with the in-process engine")
        if args.burstiness <= 0:
            raise ValueError("--burstiness must be positive")
    except (ValueError, OSError, *_config_errors()) as error:  # bad arguments or configuration: one line, status 2
        console.print(f"[red]bench: {error}[/red]")
        return 2
    sampling = BenchSampling(
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
        speculation={"default": None, "on": True, "off": False}[args.speculation],
    )
    options = _backend_options(args, settings)
    config = {
        "backend": args.backend, "compare_inprocess": args.compare_inprocess,
        "workload": None if args.dataset else args.workload, "dataset": args.dataset,
        "lengths": {"input_len": args.input_len, "input_len_jitter": args.input_len_jitter,
                    "output_len": args.output_len, "output_len_jitter": args.output_len_jitter},
        "sampling": {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k, "speculation": args.speculation},
        "rounds": args.rounds if args.compare_inprocess else None,
        "seed": args.seed, "slo_ms": {k: v * 1000 for k, v in slo.items()},
        "loads": [load.describe() for load in loads],
        "model": options.model, "base_url": options.base_url, "bootstrap_servers": options.bootstrap_servers,
    }
    sink_cm: Any = _NullContext() if args.no_progress else RichSink(console)
    sink = sink_cm if isinstance(sink_cm, ProgressSink) else ProgressSink()
    overheads: list[dict[str, Any]] = []
    with sink_cm:
        if args.compare_inprocess:
            runs, overheads = await _run_compare(options, loads, args, sampling, lengths, slo, sink, console)
        else:
            runs = await _run_backend(args.backend, options, loads, args, sampling, lengths, slo, sink, console)
    overhead: Any = None if not overheads else overheads[0] if len(overheads) == 1 else overheads
    result = result_file(config, runs, argv, overhead)
    out_console.print(summary_table(runs))
    for item in overheads:
        out_console.print(overhead_table(item))
    if args.out:
        write_json(args.out, result)
        console.print(f"result: {args.out}")
    plot_path = args.plot if args.plot else (str(Path(args.out).with_suffix(".png")) if args.out else None)
    if plot_path and plot_path != "none":
        try:
            from streams.bench.plot import plot

            plot(result, plot_path)
            console.print(f"plot: {plot_path}")
        except ImportError:
            console.print("[yellow]matplotlib is not installed: no plot[/yellow]")
    completed = sum(r["requests"]["completed"] for r in runs)
    failed = sum(r["requests"]["failed"] for r in runs)
    if completed == 0:
        console.print("[red]no request completed[/red]")
        return 1
    return 1 if args.strict and failed else 0


def compare_main(argv: list[str]) -> int:
    from rich.console import Console

    args = build_compare_parser().parse_args(argv)
    console = Console()
    try:
        a, b = load_result(args.a), load_result(args.b)
    except ValueError as error:
        Console(stderr=True).print(f"[red]bench compare: {error}[/red]")
        return 2
    if args.json:
        print(json.dumps(ratios(a, b), indent=2))
        return 0
    for table in compare_table(a, b, Path(args.a).name, Path(args.b).name):
        console.print(table)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of `specstream bench ...` (argv without the 'bench')."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "compare":
        return compare_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return asyncio.run(_bench(args, argv))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
