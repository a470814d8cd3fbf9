"""Our pipeline over a vLLM worker against ``vllm serve``: same model, same engine arguments, same load.

    .venv/bin/python -m infra.kafka start
    .venv/bin/python -m bench.vllm_backend --concurrency 1,8,16 --rounds 2

Each round starts vLLM's OpenAI server (what ``vllm serve`` runs) (from .venv-vllm) and then our stack (edge + a worker with ``engine.backend:
vllm``), one at a time, and drives each OpenAI door with ``specstream bench`` (closed loop, the chat workload,
greedy, fixed output length). Both run vLLM with the arguments ``streams.worker.vllm_mapping.engine_kwargs`` derives
from the same engine settings, with both cores bound (VLLM_CPU_OMP_THREADS_BIND=0-1). Prints one JSON line: per
concurrency, output tokens/s and TTFT p50 of each side (medians over rounds) and their ratio / difference; the raw
``specstream bench`` files land beside ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.openai_load import drive
from bench.result_files import default_out
from engine.config import EngineConfig
from engine.engine_setup import resolve_max_model_len
from engine.loader import resolve_model_dir
from streams.commands.vllm_env import vllm_python
from streams.testing.stack import free_port, running_stack
from streams.worker.vllm_mapping import engine_kwargs

# The settings both sides run with (ours as SPECSTREAM_* variables; vllm serve gets the mapped arguments).
SETTINGS = {"max_model_len": 2048, "kv_cache_bytes": "1GiB", "max_running_requests": 64}
ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0-1", "OMP_NUM_THREADS": "2"}


def serve_argv(config: EngineConfig, port: int) -> list[str]:
    """``vllm serve`` arguments equal to what our vLLM worker passes to EngineArgs."""
    from transformers import AutoConfig

    model_dir = resolve_model_dir(config.model)
    max_len = resolve_max_model_len(config.max_model_len, AutoConfig.from_pretrained(model_dir).max_position_embeddings)
    kwargs = engine_kwargs(config, str(model_dir), max_len)
    # The api_server module is what `vllm serve` runs; the `vllm` script itself asks for the distribution "vllm",
    # which the CPU build (distribution "vllm-cpu") is not.
    argv = [str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server", "--model", kwargs.pop("model"),
            "--port", str(port), "--served-model-name", config.model]
    for key, value in kwargs.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + key.replace("_", "-"))
        else:
            argv += [flag, json.dumps(value) if isinstance(value, dict) else str(value)]
    return argv


def _wait_up(url: str, process: subprocess.Popen[bytes], timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"vllm serve exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"{url} not up after {timeout_s:.0f}s")


def bench(base_url: str, api_key: str | None, concurrency: int, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    return drive(base_url, api_key, ["--workload", "chat"], concurrency=concurrency,
                 requests=max(8, concurrency * args.requests_per_slot), output_len=args.output_len, out=out)


def one_round(round_no: int, args: argparse.Namespace, raw: Path) -> dict[str, dict[str, dict[str, Any]]]:
    figures: dict[str, dict[str, dict[str, Any]]] = {"vllm_serve": {}, "ours_over_vllm": {}}
    config = EngineConfig(backend="vllm", **SETTINGS)
    port = free_port()
    with subprocess.Popen(serve_argv(config, port), env={**os.environ, **ENV}, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL) as server:
        try:
            _wait_up(f"http://127.0.0.1:{port}", server)
            for c in args.concurrency:
                figures["vllm_serve"][str(c)] = bench(f"http://127.0.0.1:{port}", None, c, args,
                                                      raw / f"r{round_no}-vllm-serve-c{c}.json")
        finally:
            server.terminate()
            server.wait(60)
    env = {**ENV, "SPECSTREAM_ENGINE__BACKEND": "vllm",
           **{f"SPECSTREAM_ENGINE__{k.upper()}": str(v) for k, v in SETTINGS.items()}}
    with running_stack(args.bootstrap, env=env, ready_timeout_s=600) as stack:
        for c in args.concurrency:
            figures["ours_over_vllm"][str(c)] = bench(stack.base_url, stack.api_key, c, args,
                                                      raw / f"r{round_no}-ours-c{c}.json")
    return figures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 16])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests-per-slot", type=int, default=4, help="requests per concurrent slot (at least 8)")
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--bootstrap", default="127.0.0.1:9092")
    ap.add_argument("--out", default=default_out("vllm-backend"))
    args = ap.parse_args(argv)
    raw = Path(tempfile.mkdtemp(prefix="vllm-backend-"))
    rounds = []
    for r in range(args.rounds):
        rounds.append(one_round(r, args, raw))
        print(f"round {r + 1}/{args.rounds}: {json.dumps(rounds[-1])}", file=sys.stderr, flush=True)
    summary: dict[str, Any] = {"settings": SETTINGS, "env": ENV, "output_len": args.output_len, "rounds": rounds,
                               "by_concurrency": {}}
    for c in map(str, args.concurrency):
        med = {side: {k: statistics.median(r[side][c][k] for r in rounds) for k in ("output_tok_s", "ttft_p50_ms")}
               for side in ("vllm_serve", "ours_over_vllm")}
        summary["by_concurrency"][c] = {
            **med, "throughput_ratio": med["ours_over_vllm"]["output_tok_s"] / med["vllm_serve"]["output_tok_s"],
            "added_ttft_p50_ms": med["ours_over_vllm"]["ttft_p50_ms"] - med["vllm_serve"]["ttft_p50_ms"]}
    Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary["by_concurrency"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
