"""Where each weight kernel wins, by row count: one step's linears of the default model.

    python -m bench.quant_crossover            # rows 1..64, best of 5
    python -m bench.quant_crossover --reps 9

Times the 30 layers' fused linears (qkv, o, gate_up, down) plus the LM head for
one step of T rows with: fp32 (MKL), fp32 oneDNN-prepacked, bf16 prepacked, int8
and int4 (bf16 activations). The last row count where int4 (int8) beats the bf16
copy is the crossover the engine measures for itself at start (engine.kernel_dispatch:
auto; MAX_QUANT_ROWS is the fixed fallback); this bench shows it per format; "bf16
unpadded" at 1 row against "bf16 prepacked" is what Bf16Kernel's row-count
invariance (a 1-row step run as 2 rows) costs. Run it on
a quiet machine: other processes' threads make GEMM timings meaningless.
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from engine.quant.linear import Bf16Kernel, Int4Kernel, Int8Kernel
from engine.quant.tensor import quantize

# The default model (SmolLM2-135M): hidden 576, intermediate 1536, 9 q heads + 3 kv heads of 64, vocab 49152.
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
LAYERS, HEAD = 30, (49152, 576)
ROWS = (1, 2, 4, 6, 8, 9, 10, 12, 16, 24, 32, 48, 64)


def _kernels(weight: torch.Tensor) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    packed = torch.ops.mkldnn._reorder_linear_weight(weight)
    int4, int8, bf16 = Int4Kernel(quantize(weight, "int4")), Int8Kernel(quantize(weight, "int8")), Bf16Kernel(weight)
    return {
        "fp32": lambda x: F.linear(x, weight),
        "fp32 prepacked": lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""),
        "bf16 prepacked": lambda x: bf16(x.bfloat16()),
        # oneDNN without Bf16Kernel's 1-row padding: row 1 against "bf16 prepacked" is its cost.
        "bf16 unpadded": lambda x: torch.ops.mkldnn._linear_pointwise(x.bfloat16(), bf16.packed, None, "none", [], ""),
        "int8": lambda x: int8(x.bfloat16()),
        "int4": lambda x: int4(x.bfloat16()),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    # One layer's kernels timed and scaled by the layer count: the weights of 30 distinct
    # layers would not change a memory-bound figure much, and keep this light to run.
    layer = [_kernels(torch.randn(s) * 0.05) for s in SHAPES]
    head = _kernels(torch.randn(HEAD) * 0.05)
    names = list(head)
    print("| rows | " + " | ".join(f"{n} ms" for n in names) + " |")
    print("|---" * (len(names) + 1) + "|")
    best_quant = {"int4": 0, "int8": 0}
    with torch.inference_mode():
        for rows in ROWS:
            xs = {s[1]: torch.randn(rows, s[1]) for s in [*SHAPES, HEAD]}
            times = {}
            for name in names:
                def step() -> None:
                    for k, s in zip(layer, SHAPES):
                        k[name](xs[s[1]])

                best = float("inf")
                for _ in range(args.reps):
                    t0 = time.perf_counter()
                    step()
                    t1 = time.perf_counter()
                    head[name](xs[HEAD[1]])
                    t2 = time.perf_counter()
                    best = min(best, (t1 - t0) * LAYERS + (t2 - t1))
                times[name] = best * 1e3
            for q in best_quant:
                if times[q] <= times["bf16 prepacked"]:
                    best_quant[q] = rows
            print(f"| {rows} | " + " | ".join(f"{times[n]:.1f}" for n in names) + " |")
    print(f"\nlast row count where the quantized kernel beats the bf16 copy: {best_quant}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
