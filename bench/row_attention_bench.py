"""The row and chunk kernels (engine/fused/row_attention.h, chunk_attention.h) against SDPA, per layer
(54e26a1:docs/benchmarks.md).

    python -m bench.row_attention_bench --threads 2

Times one layer's attention with the default model's heads (9 query, 3 KV, head size 64). First a decode (1 row)
and verifications (4 and 9 rows) over 128, 450 and 1000 keys: one row-kernel call for all rows, against one SDPA
call per row (what the layers did so that each row rounds as its decode). Then prompt chunks, first (causal) and
after a cached prefix (masked): the chunk kernel, the row kernel and one SDPA call (what the layers did for
chunks). Best of three rounds.
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from engine.fused.build import load_ops


def _best_us(fn: Callable[[], object], calls: int, rounds: int = 3) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="torch threads (SDPA uses them; the kernel one)")
    parser.add_argument("--calls", type=int, default=500)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    built = load_ops("decoder_step")
    if built.library is None:
        raise SystemExit(f"the row kernel is not available: {built.why}")
    kernel = torch.ops.specstream.row_attention
    g = torch.Generator().manual_seed(0)
    q = torch.randn(9, 9, 64, generator=g)
    k, v = torch.randn(3, 2048, 64, generator=g), torch.randn(3, 2048, 64, generator=g)
    print("| keys | rows | row kernel (one call) | SDPA, one call per row |\n|---|---|---|---|")
    for keys in (128, 450, 1000):
        for rows in (1, 4, 9):
            qs = q[:rows]

            def by_rows() -> None:
                for r in range(rows):
                    F.scaled_dot_product_attention(
                        qs[r : r + 1].transpose(0, 1), k[:, : keys + r], v[:, : keys + r], enable_gqa=True
                    )

            ours = _best_us(lambda: kernel(qs, k, v, keys), args.calls)
            sdpa = _best_us(by_rows, args.calls)
            print(f"| {keys} | {rows} | {ours:.1f} µs | {sdpa:.1f} µs |")
    _chunks(kernel, torch.ops.specstream.chunk_attention, max(5, args.calls // 50))


def _chunks(row_kernel: Callable[..., torch.Tensor], chunk_kernel: Callable[..., torch.Tensor], calls: int) -> None:
    g = torch.Generator().manual_seed(1)
    print("\n| prompt chunk rows | cached before it | chunk kernel | row kernel | SDPA, one call |\n|---|---|---|---|---|")
    for rows, prefix in ((64, 0), (512, 0), (123, 512), (512, 512)):
        q = torch.randn(rows, 9, 64, generator=g)
        k, v = torch.randn(3, prefix + rows, 64, generator=g), torch.randn(3, prefix + rows, 64, generator=g)
        mask = torch.ones(rows, prefix + rows, dtype=torch.bool).tril(prefix) if prefix else None

        def sdpa() -> None:
            F.scaled_dot_product_attention(q.transpose(0, 1), k, v, attn_mask=mask, is_causal=mask is None,
                                           enable_gqa=True)  # fmt: skip

        times = [_best_us(fn, calls) / 1000 for fn in (lambda: chunk_kernel(q, k, v, prefix + 1),
                                                      lambda: row_kernel(q, k, v, prefix + 1), sdpa)]  # fmt: skip
        print(f"| {rows} | {prefix} | " + " | ".join(f"{t:.2f} ms" for t in times) + " |")


if __name__ == "__main__":
    main()
