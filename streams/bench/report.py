"""Figures of a run, the result file, the summary table and the side-by-side comparison.

Result file (``--out``), schema ``specstream.bench/1``::

    {
      "schema": "specstream.bench/1",
      "created_at": "...", "command": [...argv...], "environment": {...},
      "config": {backend, workload, lengths, sampling, load, slo, ...},
      "runs": [ RUN, ... ],            # one per rate of a sweep; [service, inprocess] with --compare-inprocess
      "bus_overhead": {...} | null     # --compare-inprocess only
    }

    RUN = {
      "label", "backend": {...}, "load": {...},
      "duration_s", "requests": {"total", "completed", "failed"},
      "tokens": {"input", "output"},
      "request_throughput", "output_throughput", "total_token_throughput",   # per second, completed requests only
      "goodput": {"slo_ms": {...}, "good", "requests_per_s", "fraction"},
      "ttft_ms" | "tpot_ms" | "itl_ms" | "inter_chunk_ms" | "e2e_ms" | "server_ttft_ms":
          {"count", "mean", "std", "min", "p50", "p90", "p99", "max"},
      "spec": {"drafted", "accepted", "acceptance_rate", "mean_accepted_length", "tokens_per_chunk"},
      "errors": {"total", "by_kind": {kind: n}, "examples": {kind: message}},
      "schedule": {"target_rate", "achieved_send_rate", "lag_ms": {...}},
      "per_request": [{id, index, workload, ok, error, start_s, ttft_s, tpot_s, e2e_s, ...}, ...]
    }

All latency figures are in milliseconds and computed over completed requests
only; a failed request counts in ``errors`` and in goodput's denominator, never
in the latency figures.
"""
from __future__ import annotations

import json
import math
import platform
import socket
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

from streams.bench.record import RequestRecord
from streams.bench.runner import LoadRun
from streams.bench.stats import goodput, summarize

SCHEMA = "specstream.bench/1"
LATENCIES = ("ttft_ms", "tpot_ms", "itl_ms", "inter_chunk_ms", "e2e_ms")


def run_result(outcome: LoadRun, slo: dict[str, float], backend_info: dict[str, Any], detail: bool = True) -> dict[str, Any]:
    records = outcome.records
    ok = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    duration = outcome.duration_s
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens or 0 for r in ok)
    drafted = sum(r.spec_drafted for r in ok)
    accepted = sum(r.spec_accepted for r in ok)
    spec_steps = sum(r.spec_steps for r in ok)
    token_chunks = sum(1 for r in ok for c in r.chunks if c.tokens > 0)
    server_ttft, transport_ttft, transport_e2e = [], [], []
    for r in ok:
        timings = r.server.get("timings")
        if not isinstance(timings, dict):
            continue
        if timings.get("ttft_s") is not None:
            server_ttft.append(timings["ttft_s"])
            if r.ttft is not None:
                transport_ttft.append(r.ttft - timings["ttft_s"])
        if timings.get("total_s") is not None and r.e2e is not None:
            transport_e2e.append(r.e2e - timings["total_s"])
    good = goodput([r.slo_metrics() for r in ok], len(failed), slo, duration)
    kinds = Counter(r.error_kind or "protocol:missing_final" for r in failed)
    examples: dict[str, str] = {}
    for r in failed:
        kind = r.error_kind or "protocol:missing_final"
        examples.setdefault(kind, r.error_message or "")
    starts = sorted(r.start for r in records)
    send_span = starts[-1] - starts[0] if len(starts) > 1 else 0.0
    result: dict[str, Any] = {
        "label": outcome.label,
        "backend": backend_info,
        "load": outcome.load.describe(),
        "duration_s": duration,
        "requests": {"total": len(records), "completed": len(ok), "failed": len(failed), "warmup": len(outcome.warmup_records),
                     "warmup_failed": sum(1 for r in outcome.warmup_records if not r.ok)},
        "tokens": {"input": in_tokens, "output": out_tokens},
        "request_throughput": len(ok) / duration,
        "output_throughput": out_tokens / duration,
        "total_token_throughput": (in_tokens + out_tokens) / duration,
        "goodput": {
            "slo_ms": {k: v * 1000 for k, v in slo.items()}, "good": good.good,
            "requests_per_s": good.goodput, "fraction": good.fraction,
        },
        "ttft_ms": summarize([r.ttft for r in ok if r.ttft is not None], 1000),
        "tpot_ms": summarize([r.tpot for r in ok if r.tpot is not None], 1000),
        "itl_ms": summarize([x for r in ok for x in r.itl], 1000),
        "inter_chunk_ms": summarize([x for r in ok for x in r.inter_chunk], 1000),
        "e2e_ms": summarize([r.e2e for r in ok if r.e2e is not None], 1000),
        "server_ttft_ms": summarize(server_ttft, 1000),
        # What the client saw minus what the server reported for the same request: the time spent outside the
        # server's clock (see docs/bench.md for what each backend's server clock covers).
        "client_minus_server_ttft_ms": summarize(transport_ttft, 1000),
        "client_minus_server_e2e_ms": summarize(transport_e2e, 1000),
        "spec": {
            "drafted": drafted, "accepted": accepted,
            "acceptance_rate": accepted / drafted if drafted else None,
            # Tokens emitted per verification step: the accepted drafts plus the target's own token.
            "mean_accepted_length": 1 + accepted / spec_steps if spec_steps else None,
            "tokens_per_chunk": out_tokens / token_chunks if token_chunks else None,
            "exposed": any(c.drafted or c.accepted for r in ok for c in r.chunks) or drafted > 0,
        },
        "errors": {"total": len(failed), "by_kind": dict(sorted(kinds.items())), "examples": examples},
        "schedule": {
            "target_rate": None if outcome.load.rate is None else (outcome.load.rate if math.isfinite(outcome.load.rate) else "inf"),
            "achieved_send_rate": (len(starts) - 1) / send_span if send_span > 0 else None,
            "lag_ms": summarize(outcome.schedule_lag, 1000) if outcome.schedule_lag else None,
        },
    }
    if detail:
        result["per_request"] = [r.to_json(outcome.t0) for r in records]
    return result


def paired_differences(service: list[RequestRecord], inprocess: list[RequestRecord]) -> dict[str, Any]:
    """Per request (same index: same prompt, max_tokens and seed), service minus in-process, in ms.

    Pairing removes what differs between requests (prompt length, output
    length), which otherwise dominates the spread of TTFT and E2E in a mixed
    workload; what is left is the added latency plus noise.
    """
    by_index = {r.request.index: r for r in inprocess if r.ok}
    pairs = [(s, by_index[s.request.index]) for s in service if s.ok and s.request.index in by_index]
    out: dict[str, Any] = {"pairs": len(pairs)}
    for name in ("ttft", "e2e", "tpot"):
        diffs = [getattr(a, name) - getattr(b, name) for a, b in pairs
                 if getattr(a, name) is not None and getattr(b, name) is not None]
        out[f"{name}_ms"] = summarize(diffs, 1000)
    out["same_output_tokens"] = sum(1 for a, b in pairs if a.output_tokens == b.output_tokens)
    return out


def bus_overhead(
    service: dict[str, Any], inprocess: dict[str, Any],
    service_records: list[RequestRecord] | None = None, inprocess_records: list[RequestRecord] | None = None,
    rounds: int = 1,
) -> dict[str, Any]:
    """Added latency (service - in-process) at p50/p99 and the throughput ratio, with the team's targets.

    ``added_*``: differences of the two runs' percentiles (what a user sees).
    ``paired``: percentiles of per-request differences (less noisy; see :func:`paired_differences`).
    The targets are judged on the paired medians and on the unpaired p99 and throughput.
    """
    out: dict[str, Any] = {"service": service["label"], "inprocess": inprocess["label"], "rounds": rounds}
    for metric in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
        added = {}
        for p in ("mean", "p50", "p99"):
            a, b = service[metric].get(p), inprocess[metric].get(p)
            added[p] = None if a is None or b is None else a - b
        out[f"added_{metric}"] = added
    base = inprocess["output_throughput"]
    out["output_throughput_ratio"] = service["output_throughput"] / base if base else None
    base_r = inprocess["request_throughput"]
    out["request_throughput_ratio"] = service["request_throughput"] / base_r if base_r else None
    paired = paired_differences(service_records, inprocess_records) if service_records is not None and inprocess_records is not None else None
    out["paired"] = paired
    p50_ttft = paired["ttft_ms"]["p50"] if paired else out["added_ttft_ms"]["p50"]
    p50_e2e = paired["e2e_ms"]["p50"] if paired else out["added_e2e_ms"]["p50"]
    out["transport_ms"] = {
        "service_ttft": service.get("client_minus_server_ttft_ms"), "inprocess_ttft": inprocess.get("client_minus_server_ttft_ms"),
        "service_e2e": service.get("client_minus_server_e2e_ms"), "inprocess_e2e": inprocess.get("client_minus_server_e2e_ms"),
    }
    targets = {"added_ttft_p50_ms<=5": _le(p50_ttft, 5.0),
               "added_ttft_p99_ms<=25": _le(out["added_ttft_ms"]["p99"], 25.0),
               "added_e2e_p50_ms<=5": _le(p50_e2e, 5.0),
               "added_e2e_p99_ms<=25": _le(out["added_e2e_ms"]["p99"], 25.0),
               "throughput_ratio>=0.95": None if out["output_throughput_ratio"] is None else out["output_throughput_ratio"] >= 0.95}
    out["targets"] = targets
    return out


def _le(value: float | None, bound: float) -> bool | None:
    return None if value is None else value <= bound


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {"host": socket.gethostname(), "python": platform.python_version(), "platform": platform.platform()}
    try:
        env["git_commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5, check=False,
        ).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        env["git_commit"] = None
    try:
        import os

        env["cpus"] = os.cpu_count()
    except Exception:  # noqa: BLE001
        pass
    return env


def result_file(config: dict[str, Any], runs: list[dict[str, Any]], argv: list[str], overhead: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": ["specstream", "bench", *argv],
        "environment": environment(),
        "config": config,
        "runs": runs,
        "bus_overhead": overhead,
    }


def write_json(path: str | Path, data: dict[str, Any]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(_clean(data), indent=2) + "\n", encoding="utf-8")


def _clean(value: Any) -> Any:
    """NaN/inf are not JSON: NaN becomes null, inf the string 'inf'."""
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def load_result(path: str | Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror or error}") from None
    except ValueError as error:
        raise ValueError(f"{path}: not JSON: {error}") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("runs"), list):
        raise ValueError(f"{path}: not a specstream bench result (schema {SCHEMA})")
    return data


# --- tables ------------------------------------------------------------------------------------------------------

# (label, getter, format, higher_is_better)
def _rows() -> list[tuple[str, Any, str, bool | None]]:
    rows: list[tuple[str, Any, str, bool | None]] = [
        ("completed / total", lambda r: f"{r['requests']['completed']} / {r['requests']['total']}", "s", None),
        ("errors", lambda r: r["errors"]["total"], "d", False),
        ("duration (s)", lambda r: r["duration_s"], ".2f", None),
        ("request throughput (req/s)", lambda r: r["request_throughput"], ".3f", True),
        ("output throughput (tok/s)", lambda r: r["output_throughput"], ".1f", True),
        ("total token throughput (tok/s)", lambda r: r["total_token_throughput"], ".1f", True),
        ("goodput (req/s)", lambda r: r["goodput"]["requests_per_s"], ".3f", True),
        ("goodput fraction", lambda r: r["goodput"]["fraction"], ".1%", True),
        ("input / output tokens", lambda r: f"{r['tokens']['input']} / {r['tokens']['output']}", "s", None),
    ]
    names = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "itl_ms": "ITL", "e2e_ms": "E2E latency"}
    for key, name in names.items():
        for stat in ("mean", "p50", "p90", "p99"):
            rows.append((f"{name} {stat} (ms)", lambda r, k=key, s=stat: r[k].get(s), ".2f", False))
    rows += [
        ("acceptance rate", lambda r: r["spec"]["acceptance_rate"], ".1%", True),
        ("mean accepted length", lambda r: r["spec"]["mean_accepted_length"], ".2f", True),
        ("tokens per chunk", lambda r: r["spec"]["tokens_per_chunk"], ".2f", None),
    ]
    return rows


def _fmt(value: Any, spec: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    try:
        return format(value, spec)
    except (TypeError, ValueError):
        return str(value)


def summary_table(runs: list[dict[str, Any]], title: str = "specstream bench") -> Any:
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    table.add_column("metric")
    for run in runs:
        table.add_column(run["label"] or run["backend"].get("backend", "run"), justify="right")
    for label, get, spec, _ in _rows():
        table.add_row(label, *(_fmt(_safe(get, r), spec) for r in runs))
    kinds = sorted({k for r in runs for k in r["errors"]["by_kind"]})
    for kind in kinds:
        table.add_row(f"  error {kind}", *(str(r["errors"]["by_kind"].get(kind, 0)) for r in runs))
    return table


def _safe(get: Any, run: dict[str, Any]) -> Any:
    try:
        return get(run)
    except (KeyError, TypeError):
        return None


def overhead_table(overhead: dict[str, Any]) -> Any:
    from rich.table import Table

    table = Table(title=f"bus overhead: {overhead['service']} vs {overhead['inprocess']}", title_justify="left")
    table.add_column("added latency (ms)")
    for p in ("mean", "p50", "p99"):
        table.add_column(p, justify="right")
    for metric, name in (("ttft_ms", "TTFT"), ("itl_ms", "ITL"), ("tpot_ms", "TPOT"), ("e2e_ms", "E2E")):
        added = overhead[f"added_{metric}"]
        table.add_row(f"{name} (p of each run)", *(_fmt(added[p], "+.2f") for p in ("mean", "p50", "p99")))
    paired = overhead.get("paired")
    if paired:
        for metric, name in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2e_ms", "E2E")):
            table.add_row(f"{name} (paired, {paired['pairs']} requests)", *(_fmt(paired[metric].get(p), "+.2f") for p in ("mean", "p50", "p99")))
    transport = overhead.get("transport_ms") or {}
    for key, name in (("service_ttft", "client-server TTFT, service"), ("inprocess_ttft", "client-engine TTFT, in-process"),
                      ("service_e2e", "client-server E2E, service"), ("inprocess_e2e", "client-engine E2E, in-process")):
        figures = transport.get(key)
        if figures and figures.get("count"):
            table.add_row(name, *(_fmt(figures.get(p), ".2f") for p in ("mean", "p50", "p99")))
    ratio = overhead["output_throughput_ratio"]
    table.caption = (
        f"output throughput ratio {_fmt(ratio, '.3f')}x of in-process; targets: "
        + ", ".join(f"{k} {'ok' if v else ('n/a' if v is None else 'MISSED')}" for k, v in overhead["targets"].items())
    )
    return table


def compare_table(a: dict[str, Any], b: dict[str, Any], name_a: str, name_b: str) -> list[Any]:
    """One table per pair of runs (runs are paired by position), columns A, B, B/A."""
    from rich.table import Table

    tables = []
    for i, (ra, rb) in enumerate(zip(a["runs"], b["runs"])):
        title = f"compare run {i + 1}: {ra['label']} vs {rb['label']}" if len(a["runs"]) > 1 or len(b["runs"]) > 1 else "compare"
        table = Table(title=title, title_justify="left")
        table.add_column("metric")
        table.add_column(f"A: {name_a}", justify="right")
        table.add_column(f"B: {name_b}", justify="right")
        table.add_column("B/A", justify="right")
        for label, get, spec, better in _rows():
            va, vb = _safe(get, ra), _safe(get, rb)
            table.add_row(label, _fmt(va, spec), _fmt(vb, spec), _ratio(va, vb, better))
        tables.append(table)
    if len(a["runs"]) != len(b["runs"]):
        tables.append(f"note: A has {len(a['runs'])} runs, B has {len(b['runs'])}; compared the first {min(len(a['runs']), len(b['runs']))}")
    return tables


def ratios(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """Machine-readable comparison: per run pair, each numeric metric's A, B and B/A."""
    out = []
    for ra, rb in zip(a["runs"], b["runs"]):
        row: dict[str, Any] = {}
        for label, get, _, _ in _rows():
            va, vb = _safe(get, ra), _safe(get, rb)
            if isinstance(va, (int, float)) and isinstance(vb, (int, float)):
                row[label] = {"a": va, "b": vb, "ratio": vb / va if va else None}
        out.append(row)
    return out


def _ratio(va: Any, vb: Any, better: bool | None) -> str:
    if not isinstance(va, (int, float)) or not isinstance(vb, (int, float)) or isinstance(va, bool) or va == 0:
        return "-"
    r = vb / va
    text = f"{r:.3f}x"
    if better is None or abs(r - 1) < 0.02:
        return text
    improved = (r > 1) == better
    return f"[green]{text}[/green]" if improved else f"[red]{text}[/red]"
