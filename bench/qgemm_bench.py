"""Our int4/int8 kernel against torch's and the bf16 copy, on the default model's linear shapes.

    python -m bench.qgemm_bench                 # int4, rows 1..64, 2 threads
    python -m bench.qgemm_bench --fmt int8

Times one pass over 30 layers' worth of the default model's four linears (qkv 960x576,
o 576x576, gate_up 3072x576, down 576x1536; random weights quantized once, so the pass reads
memory as a decode step does) with each kernel at each row count, best of 7, in one process.
Only the ratios within a run mean anything on a shared machine.
"""
from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch

from engine.kernel_calibration import cpu_identity
from engine.quant.linear import Bf16Kernel, Int4Kernel, Int8Kernel
from engine.quant.tensor import quantize
from engine.quant.vnni import VnniKernel, available

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
LAYERS = 30


def _best_ms(kernels: list[Callable[[torch.Tensor], torch.Tensor]], rows: int, dtype: torch.dtype) -> float:
    xs = {i: torch.randn(rows, i).to(dtype) for _, i in SHAPES}
    ins = [i for _, i in SHAPES] * LAYERS

    def one_pass() -> float:
        start = time.perf_counter()
        for kernel, i in zip(kernels, ins):
            kernel(xs[i])
        return time.perf_counter() - start

    one_pass()
    return 1000 * min(one_pass() for _ in range(7))


def _fp32(weight: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda x: torch.nn.functional.linear(x, weight)


@torch.inference_mode()
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fmt", choices=("int4", "int8"), default="int4")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", default="1,2,4,9,16,32,64")
    ap.add_argument("--out", default="", help="write the timings as JSON here (e.g. bench/results/<date>-qgemm.json)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    qts = [quantize(torch.randn(o, i) * 0.05, args.fmt) for _ in range(LAYERS) for o, i in SHAPES]
    torch_kernel = Int4Kernel if args.fmt == "int4" else Int8Kernel
    rows_of = [int(r) for r in args.rows.split(",")]
    table = {
        f"ours {args.fmt} ({available()[1]})": ([VnniKernel(q) for q in qts], torch.float32),
        f"torch's {args.fmt}": ([torch_kernel(q) for q in qts], torch.bfloat16),
        "fp32 (the fallback format)": ([_fp32(q.dequantize()) for q in qts], torch.float32),
    }
    try:
        table["bf16 copy"] = ([Bf16Kernel(q.dequantize()) for q in qts], torch.bfloat16)
    except RuntimeError as e:  # oneDNN's bf16 GEMM refuses CPUs without AVX-512 (BW, VL, DQ)
        print(f"(no bf16 copy here: {str(e).splitlines()[0]})")
    print("| rows | " + " | ".join(map(str, rows_of)) + " |\n|---|" + "---|" * len(rows_of))
    ms: dict[str, list[float]] = {}
    for name, (kernels, dtype) in table.items():
        ms[name] = [_best_ms(kernels, r, dtype) for r in rows_of]
        print(f"| {name}, ms | " + " | ".join(f"{v:.2f}" for v in ms[name]) + " |", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"fmt": args.fmt, "threads": args.threads, "rows": rows_of, "ms": ms,
                                              "cpu": cpu_identity().split(" | ")[0]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
