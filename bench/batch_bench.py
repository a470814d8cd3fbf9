"""Batch jobs beside interactive traffic: does a batch fill idle capacity without hurting interactive latency?

One run, on a stack it starts itself (edge, engine worker, batch assembler as processes, on a topic prefix of its
own, on the Kafka at --bootstrap-servers):

1. **capacity**: the batch's lines fed through ``specstream bench`` at full concurrency (closed loop,
   ``--concurrency`` = engine.max_running_requests): the most lines/min and tokens/s the stack does;
2. **interactive alone**: a steady open-loop interactive load (``specstream bench --request-rate R``) for
   ``--duration`` seconds: TTFT p50/p99 and tokens/s;
3. **interactive + batch**: the same load while a batch of the same lines runs (``POST /v1/batches``; the load
   starts once the batch has answered ``--ramp-lines`` lines, so that it meets a running batch, not the upload
   and the publishing of its lines; what is left of the batch after the load is cancelled): the interactive
   figures again, and the batch's lines/min and tokens/s over the window.

2 and 3 alternate for ``--rounds`` rounds, and the targets read every round's requests pooled: on a shared
machine whose speed drifts, a single alone phase and a single batch phase minutes apart compare two machines.
Each round's own figures are kept in the result.

Targets (issue 18): interactive p99 TTFT with the batch at most 1.2x without; the batch uses at least 70 % of the
capacity the interactive load leaves idle, i.e. batch tok/s >= 0.7 x (capacity tok/s - interactive tok/s).
Results: a JSON file (--out) and a table on stdout. docs/performance.md has the command and the figures.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from streams.batch.validation import dumps_line
from streams.bench.stats import percentile
from streams.testing.stack import Stack, running_stack, spawn_process

REPO = Path(__file__).resolve().parent.parent
_TOPICS = ("Kafka", "speculative decoding", "continuous batching", "a bus", "consumer groups", "log compaction",
           "back-pressure", "idempotence", "retention", "partitions")


def batch_prompts(n: int) -> list[str]:
    return [f"Write one sentence about {_TOPICS[i % len(_TOPICS)]} (note {i})." for i in range(n)]


def bench_command(stack: Stack, out: Path, *load: str, dataset: Path | None, output_len: int) -> list[str]:
    command = [sys.executable, "-m", "streams.cli", "bench", "--base-url", stack.base_url, "--api-key", stack.api_key,
               "--model", stack.model, "--output-len", str(output_len), "--out", str(out), "--plot", "none",
               "--no-progress", "--warmup", "2", *load]
    return command + (["--dataset", str(dataset), "--no-shuffle"] if dataset is not None else ["--workload", "chat"])


def run_bench(command: list[str], env: dict[str, str]) -> dict[str, Any]:
    subprocess.run(command, check=True, env=env, cwd=REPO, stdout=subprocess.DEVNULL)
    out = Path(command[command.index("--out") + 1])
    return json.loads(out.read_text())["runs"][0]


def submit_batch(client: httpx.Client, prompts: list[str], output_len: int, model: str) -> str:
    lines = [dumps_line(f"line-{i}", "/v1/completions", {"model": model, "prompt": p, "max_tokens": output_len})
             for i, p in enumerate(prompts)]
    uploaded = client.post("/v1/files", files={"file": ("bench.jsonl", "\n".join(lines).encode())},
                           data={"purpose": "batch"})
    uploaded.raise_for_status()
    created = client.post("/v1/batches", json={"input_file_id": uploaded.json()["id"], "endpoint": "/v1/completions",
                                                "completion_window": "24h"})
    created.raise_for_status()
    return str(created.json()["id"])


class BatchWatch(threading.Thread):
    """Polls the batch; records (time, lines done) so lines/min over any window can be read off."""

    def __init__(self, client: httpx.Client, batch_id: str) -> None:
        super().__init__(daemon=True)
        self.client, self.batch_id = client, batch_id
        self.samples: list[tuple[float, int]] = []
        self.final: dict[str, Any] | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            batch = self.client.get(f"/v1/batches/{self.batch_id}").json()
            counts = batch["request_counts"]
            self.samples.append((time.monotonic(), counts["completed"] + counts["failed"]))
            if batch["status"] in ("completed", "failed", "expired", "cancelled"):
                self.final = batch
                return
            time.sleep(0.5)

    def wait_for_lines(self, n: int, timeout: float) -> None:
        """Until n lines are answered (the batch runs at its pace) or the batch ended."""
        deadline = time.monotonic() + timeout
        while self.final is None and (not self.samples or self.samples[-1][1] < n):
            if time.monotonic() > deadline:
                raise TimeoutError(f"batch {self.batch_id}: fewer than {n} lines answered in {timeout:.0f} s")
            time.sleep(0.2)

    def done_between(self, start: float, end: float) -> int:
        def at(t: float) -> int:
            return max([n for s, n in self.samples if s <= t], default=0)
        return at(end) - at(start)


@dataclass
class BatchWindow:
    """One round's interactive run beside a batch, and what the batch did over it."""

    mixed: dict[str, Any]
    watch: BatchWatch
    submitted: float
    started: float
    window_s: float
    tokens_per_line: float | None


def measure(args: argparse.Namespace) -> dict[str, Any]:
    env = {"SPECSTREAM_ENGINE__MAX_RUNNING_REQUESTS": str(args.max_running),
           "SPECSTREAM_ENGINE__BATCH_MAX_SHARE": str(args.batch_share),
           "SPECSTREAM_BATCH__WORKER_SLOTS": str(args.worker_slots)}
    if args.batch_step_tokens is not None:
        env["SPECSTREAM_ENGINE__BATCH_STEP_TOKENS"] = str(args.batch_step_tokens)
    if args.batch_headroom is not None:
        env["SPECSTREAM_ENGINE__BATCH_HEADROOM"] = str(args.batch_headroom)
    if args.threads is not None:
        env["SPECSTREAM_ENGINE__THREADS"] = str(args.threads)
    work = Path(tempfile.mkdtemp(prefix="batch-bench-"))
    env["SPECSTREAM_FILES__DIR"] = str(work / "files")
    prompts = batch_prompts(args.lines)
    dataset = work / "lines.jsonl"
    dataset.write_text("\n".join(json.dumps({"prompt": p}) for p in prompts) + "\n")
    with running_stack(args.bootstrap_servers, env=env, log_dir=work) as stack:
        stack.processes.append(spawn_process("assembler", ["batch", "assembler"], stack.env, work))
        benv = {**stack.env, "SPECSTREAM_CONFIG": "/dev/null"}
        interactive = ["--request-rate", str(args.rate), "--duration", str(args.duration), "--seed", "1"]
        t0 = time.monotonic()
        capacity = run_bench(bench_command(stack, work / "capacity.json", "--concurrency", str(args.max_running),
                                           "--num-requests", str(args.lines), dataset=dataset,
                                           output_len=args.output_len), benv)
        alone: list[dict[str, Any]] = []
        beside: list[BatchWindow] = []
        with httpx.Client(base_url=stack.base_url, headers=stack.headers, timeout=60) as client:
            # Alone and beside a batch alternate round by round, so that a machine whose speed drifts (a shared
            # VM's can, by 2x within a second) moves both sides alike; the targets read the pooled requests.
            for r in range(args.rounds):
                alone.append(run_bench(bench_command(stack, work / f"alone-{r}.json", *interactive, dataset=None,
                                                     output_len=args.output_len), benv))
                beside.append(run_beside_batch(args, stack, client, prompts,
                                               bench_command(stack, work / f"mixed-{r}.json", *interactive,
                                                             dataset=None, output_len=args.output_len), benv))
        return report(args, capacity, alone, beside, time.monotonic() - t0, work)


def run_beside_batch(args: argparse.Namespace, stack: Stack, client: httpx.Client, prompts: list[str],
                     command: list[str], env: dict[str, str]) -> BatchWindow:
    """Submit the batch, run the interactive load beside it once it runs, then cancel what is left of it."""
    submitted = time.monotonic()
    watch = BatchWatch(client, submit_batch(client, prompts, args.output_len, stack.model))
    watch.start()
    # The interactive run meets a batch that runs, not one being submitted: the upload, its validation and the
    # edge publishing every line are a burst of their own on this machine's cores.
    watch.wait_for_lines(args.ramp_lines, timeout=args.batch_timeout)
    started = time.monotonic()
    mixed = run_bench(command, env)
    window = time.monotonic() - started
    if watch.final is None:
        # The rest of the batch is not measured: cancelling keeps what finished (its output file) and frees the
        # engine for the next round's interactive run alone.
        cancelled = client.post(f"/v1/batches/{watch.batch_id}/cancel")
        if cancelled.status_code != 409:  # 409: it was already finishing (the watch polls twice a second)
            cancelled.raise_for_status()
    watch.join(timeout=args.batch_timeout)
    return BatchWindow(mixed, watch, submitted, started, window, mean_completion_tokens(client, watch.final))


def mean_completion_tokens(client: httpx.Client, batch: dict[str, Any] | None) -> float | None:
    """Tokens a batch line generated on average (lines may stop at EOS before max_tokens)."""
    if not batch or not batch.get("output_file_id"):
        return None
    text = client.get(f"/v1/files/{batch['output_file_id']}/content").text
    tokens = [json.loads(line)["response"]["body"]["usage"]["completion_tokens"] for line in text.splitlines()]
    return sum(tokens) / len(tokens) if tokens else None


def report(args: argparse.Namespace, capacity: dict[str, Any], alone: list[dict[str, Any]],
           beside: list[BatchWindow], total_s: float, work: Path) -> dict[str, Any]:
    rounds = [_round(a, b, args.output_len) for a, b in zip(alone, beside, strict=True)]
    alone_all, mixed_all = _pooled(alone), _pooled([b.mixed for b in beside])
    lines = sum(r["batch"]["lines_in_window"] for r in rounds)
    window = sum(r["batch"]["window_s"] for r in rounds)
    batch_tok_s = sum(r["batch"]["tok_s_in_window"] * r["batch"]["window_s"] for r in rounds) / window
    idle_tok_s = max(1e-9, capacity["output_throughput"] - alone_all["tok_s"])
    p99_ratio = mixed_all["ttft_p99_ms"] / alone_all["ttft_p99_ms"] if alone_all["ttft_p99_ms"] else None
    return {
        "config": vars(args) | {"out": str(args.out)}, "work_dir": str(work), "wall_s": total_s,
        "capacity": {"lines_per_min": capacity["request_throughput"] * 60, "tok_s": capacity["output_throughput"]},
        "interactive_alone": alone_all, "interactive_with_batch": mixed_all,
        "batch": {"lines_in_window": lines, "window_s": window, "lines_per_min_in_window": lines / window * 60,
                  "tok_s_in_window": batch_tok_s,
                  "outlasted_window": all(r["batch"]["outlasted_window"] for r in rounds)},
        "rounds": rounds,
        "targets": {"p99_ttft_ratio": p99_ratio, "p99_ttft_ratio<=1.2": p99_ratio is not None and p99_ratio <= 1.2,
                    "share_of_idle_capacity": batch_tok_s / idle_tok_s,
                    "share_of_idle_capacity>=0.7": batch_tok_s / idle_tok_s >= 0.7},
    }


def _round(alone: dict[str, Any], beside: BatchWindow, output_len: int) -> dict[str, Any]:
    watch, started, window = beside.watch, beside.started, beside.window_s
    end = watch.samples[-1][0] if watch.final and watch.final["status"] == "completed" else None
    # When the batch ends inside the window, the interactive figures "with batch" are partly without it: the
    # result says so (outlasted_window false); a longer batch or a shorter --duration fixes it.
    outlasted = end is None or end >= started + window
    if not outlasted:
        window = end - started  # the batch ended first: its rate is over the time it ran, not the whole window
    lines_in_window = watch.done_between(started, started + window)
    a, m = _interactive(alone), _interactive(beside.mixed)
    return {"interactive_alone": a, "interactive_with_batch": m,
            "p99_ttft_ratio": m["ttft_p99_ms"] / a["ttft_p99_ms"] if a["ttft_p99_ms"] else None,
            "batch": {"lines_in_window": lines_in_window, "window_s": window,
                      "lines_per_min_in_window": lines_in_window / window * 60,
                      "tok_s_in_window": lines_in_window * (beside.tokens_per_line or output_len) / window,
                      "status": watch.final["status"] if watch.final else "unfinished",
                      "tokens_per_line": beside.tokens_per_line, "outlasted_window": outlasted,
                      "ramp_s": started - beside.submitted}}


def _interactive(run: dict[str, Any]) -> dict[str, Any]:
    # server: the worker's clock (Kafka transit to it, the wait for the step in flight, its own prefill step);
    # client minus server: the edge, the reply topic and HTTP around it.
    return {"ttft_p50_ms": run["ttft_ms"]["p50"], "ttft_p99_ms": run["ttft_ms"]["p99"],
            "server_ttft_p50_ms": run["server_ttft_ms"]["p50"], "server_ttft_p99_ms": run["server_ttft_ms"]["p99"],
            "client_minus_server_ttft_p99_ms": run["client_minus_server_ttft_ms"]["p99"],
            "tok_s": run["output_throughput"], "completed": run["requests"]["completed"],
            "failed": run["requests"]["failed"]}


def _pooled(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """TTFT percentiles over every request of the runs together; tokens/s their mean."""
    ttft = [r["ttft_s"] * 1000 for run in runs for r in run["per_request"] if r["ok"]]
    return {"ttft_p50_ms": percentile(ttft, 50), "ttft_p99_ms": percentile(ttft, 99),
            "tok_s": sum(run["output_throughput"] for run in runs) / len(runs),
            "completed": sum(run["requests"]["completed"] for run in runs),
            "failed": sum(run["requests"]["failed"] for run in runs)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap-servers", default="127.0.0.1:9092")
    p.add_argument("--lines", type=int, default=500, help="lines of the batch")
    p.add_argument("--output-len", type=int, default=32, help="max_tokens of every request and line")
    p.add_argument("--rate", type=float, default=1.0, help="interactive requests per second (open loop)")
    p.add_argument("--duration", type=float, default=120.0, help="seconds of each interactive phase")
    p.add_argument("--max-running", type=int, default=16, help="engine.max_running_requests")
    p.add_argument("--batch-share", type=float, default=0.5, help="engine.batch_max_share")
    p.add_argument("--worker-slots", type=int, default=8, help="batch.worker_slots")
    p.add_argument("--batch-step-tokens", type=int, default=None, help="engine.batch_step_tokens (default: the config's)")
    p.add_argument("--batch-headroom", type=int, default=None, help="engine.batch_headroom (default: the config's)")
    p.add_argument("--threads", type=int, default=None, help="engine.threads (default: the config's)")
    p.add_argument("--rounds", type=int, default=3,
                   help="interactive runs alone and beside a batch, alternated (pooled for the targets)")
    p.add_argument("--ramp-lines", type=int, default=16,
                   help="lines the batch answers before the interactive phase beside it starts")
    p.add_argument("--batch-timeout", type=float, default=3600.0, help="seconds to wait for the batch to end")
    p.add_argument("--out", type=Path, default=Path("batch_bench.json"))
    args = p.parse_args(argv)
    result = measure(args)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("capacity", "interactive_alone", "interactive_with_batch", "batch",
                                             "targets")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
