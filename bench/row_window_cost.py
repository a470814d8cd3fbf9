"""What bf16 row-count invariance costs: wide steps cut into pieces of the measured window, against one call.

    python -m bench.row_window_cost --threads 2             # bf16, prompts of 128 and 512 tokens, 5 rounds
    python -m bench.row_window_cost --weights int4 --rounds 7

oneDNN's bf16 GEMM gives a row the same bits only within a window of row counts that
depends on the CPU (engine.quant.linear.bf16_row_window), so Bf16Kernel runs a wider step
as pieces of at most that many rows. Memory-bound steps (decode, verification) fit in one
piece and cost nothing; this times what does not: prefill (a 64-token prompt is as many rows
as 16 sequences verifying 3 drafts each). Runs the default model's whole prefill both ways in
alternated rounds and prints the medians; one process, a quiet machine.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from engine.quant import linear
from engine.quant.linear import Bf16Kernel, Bf16Linear, QuantizedLinear


def kernels(model: torch.nn.Module) -> list[Bf16Kernel]:
    found: list[Bf16Kernel] = []
    for m in model.modules():
        if isinstance(m, Bf16Linear):
            found.append(m.kernel)
        elif isinstance(m, QuantizedLinear) and isinstance(m.wide, Bf16Kernel):
            found.append(m.wide)
    return found


def timed_prefill(engine, ids: list[int]) -> float:  # type: ignore[no-untyped-def]
    from engine.request import EngineRequest, SamplingOptions

    engine.add_request(EngineRequest(f"p{time.monotonic_ns()}", ids, SamplingOptions(max_tokens=1, temperature=0.0)))
    t0 = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", default="bf16", choices=("bf16", "int8", "int4"))
    ap.add_argument("--prompts", default="64,128,512", help="comma-separated prompt lengths (tokens)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from engine.config import embedded_engine_config
    from engine.llm_engine import LLMEngine

    engine = LLMEngine.from_config(embedded_engine_config(model="smollm2-135m-instruct", weights=args.weights,
                                                kv_cache_bytes=256 << 20))
    found = kernels(engine.model)
    windows = {linear.bf16_row_window(k.out_features, k.in_features) for k in found}
    print(f"{args.weights}, {torch.get_num_threads()} threads: {len(found)} bf16 kernels, windows {sorted(windows)}")
    measured = dict(linear._row_windows)
    one_call = {key: 1 << 30 for key in measured}  # every step in one oneDNN call, as before the pieces
    lengths = [int(n) for n in args.prompts.split(",")]
    times: dict[tuple[int, str], list[float]] = {(n, how): [] for n in lengths for how in ("pieces", "one call")}
    for r in range(args.rounds):
        for n in lengths:
            ids = [(7 * i + r) % 40000 + 100 for i in range(n)]
            for how in ("pieces", "one call") if r % 2 == 0 else ("one call", "pieces"):
                linear._row_windows.update(measured if how == "pieces" else one_call)
                times[(n, how)].append(timed_prefill(engine, ids))
    print("| prompt tokens | one call ms | pieces ms | pieces / one call |\n|---|---|---|---|")
    for n in lengths:
        one, pieces = (statistics.median(times[(n, h)]) * 1e3 for h in ("one call", "pieces"))
        print(f"| {n} | {one:.0f} | {pieces:.0f} | {pieces / one:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
