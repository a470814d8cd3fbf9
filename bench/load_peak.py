"""How much memory an engine's start holds beyond the weights it keeps (issue 38: at most ~1.1x).

    python -m bench.load_peak --model gemma-3-270m --weights gguf,int4,fp32

Each format starts an engine in a process of its own (the default config, speculation off, 16 MiB of KV). The
tokenizer is loaded first and the process's peak RSS is reset after it (/proc/self/clear_refs), so the peak
counts only the weights' part of the start: reading, fusing, quantizing or packing them, the kernel dispatch
and the fused step. Printed: that peak above the RSS before it, the resident weights (weight_bytes), and their
ratio; the tokenizer's own share alongside. Caches warm (a second start): run it twice after a fresh install.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from bench.result_files import default_out


def _kib(field: str) -> int:
    from streams.testing.reliability import vm_kib

    return vm_kib(os.getpid(), field)


def measure(model: str, weights: str) -> dict[str, float]:
    """In this process: the start's figures in MiB (run in a fresh process: peak RSS only ever grows)."""
    import engine.loader as loader
    from engine.config import SpeculationConfig, embedded_engine_config
    from engine.llm_engine import LLMEngine
    from engine.quant.apply import weight_bytes

    marks: dict[str, int] = {"before": _kib("VmRSS")}
    tokenizer = loader.tokenizer_from_folder

    def after_tokenizer(path: Path):  # type: ignore[no-untyped-def]
        loaded = tokenizer(path)
        marks["tokenizer peak"] = _kib("VmHWM")
        Path("/proc/self/clear_refs").write_text("5")  # peak RSS := RSS now
        marks["after tokenizer"] = _kib("VmRSS")
        return loaded

    loader.tokenizer_from_folder = after_tokenizer
    cfg = embedded_engine_config(model=model, weights=weights, kv_cache_bytes=16 << 20,
                                 speculation=SpeculationConfig(enabled=False))  # fmt: skip
    engine = LLMEngine.from_config(cfg)
    kept = weight_bytes(engine.model) / 2**20
    peak = (_kib("VmHWM") - marks["after tokenizer"]) / 1024
    return {
        "weights_mib": round(kept, 1), "load_peak_mib": round(peak, 1), "ratio": round(peak / kept, 3),
        "tokenizer_mib": round((marks["after tokenizer"] - marks["before"]) / 1024, 1),
        "tokenizer_peak_mib": round((marks["tokenizer peak"] - marks["before"]) / 1024, 1),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--weights", default="gguf,int4,fp32", help="comma-separated engine.weights values")
    ap.add_argument("--out", default=default_out("load-peak"))
    ap.add_argument("--one", help=argparse.SUPPRESS)  # the child: measure this format, print JSON
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.model, args.one)))
        return 0
    rows = []
    print("| model | weights | resident weights | load peak above it | peak / weights | tokenizer (its peak) |")
    print("|---|---|---|---|---|---|")
    for fmt in args.weights.split(","):
        cmd = [sys.executable, "-m", "bench.load_peak", "--model", args.model, "--one", fmt]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        row = {"model": args.model, "weights": fmt} | json.loads(done.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(f"| {args.model} | {fmt} | {row['weights_mib']:.0f} MiB | {row['load_peak_mib']:.0f} MiB | "
              f"{row['ratio']:.2f}x | {row['tokenizer_mib']:.0f} MiB ({row['tokenizer_peak_mib']:.0f}) |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
