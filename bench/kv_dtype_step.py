"""What a step costs with fp32 and with bfloat16 K and V (engine.kv_cache_dtype), one process, alternated (issue 17).

    python -m bench.kv_dtype_step                      # int4 on llama.cpp's Q4_0 file, 700 cached positions
    python -m bench.kv_dtype_step --rows 1,4 --rounds 20 --cached 1500

Builds one engine per arena type, prefills the RAG prompt (repeated to length) into each, then times forwards of
R rows at that position, the layers and the LM head as a decode or verification step runs them, without moving
the sequence on (each forward rewrites the same slots). The engines take turns round by round, so the machine's
drift falls on both; the figure that means something is the median of the per-round ratios.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from bench.llama_cpp_compare import made_file
from bench.workloads import RAG_ANSWER
from engine.config import SpeculationConfig, embedded_engine_config
from engine.llm_engine import LLMEngine
from engine.runner import FlatBatchBuilder

DTYPES = ("float32", "bfloat16")


def _forward(engine: LLMEngine, ids: list[int], cached: int, prompt: bool) -> torch.Tensor:
    """Rows ids[cached:] after `cached` positions of the sequence in arena slots from 0: the logits."""
    builder = FlatBatchBuilder("cpu")
    builder.add(ids[cached:], cached, 0, prompt=prompt)
    with torch.inference_mode():
        return engine.model.compute_logits(engine.model(*builder.build(engine.kv_cache)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", default="int4")
    ap.add_argument("--model", default=None, help="default: llama.cpp's Q4_0 file (bench.llama_cpp_compare)")
    ap.add_argument("--cached", type=int, default=700, help="positions already in the cache")
    ap.add_argument("--rows", default="1,2,3,4,6,9")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--calls", type=int, default=10, help="forwards timed per round")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = args.model or str(made_file("Q4_0"))
    rows = [int(r) for r in args.rows.split(",")]
    engines = {
        kv: LLMEngine.from_config(embedded_engine_config(
            model=model, weights=args.weights, kv_cache_dtype=kv, kv_cache_bytes=64 << 20,
            speculation=SpeculationConfig(enabled=False),
        ))
        for kv in DTYPES
    }  # fmt: skip
    prompt = RAG_ANSWER.token_ids(engines["float32"].tokenizer)
    ids = (prompt * (args.cached // len(prompt) + 2))[: args.cached + max(rows)]
    for engine in engines.values():  # the prefix, in prompt chunks of at most 512 rows
        for start in range(0, args.cached, 512):
            _forward(engine, ids[: min(start + 512, args.cached)], start, prompt=True)
    print(f"{args.weights}, {args.cached} cached positions, {args.threads} threads: ms per forward (medians)")
    print("| rows | fp32 K, V | bfloat16 | bfloat16 / fp32, median of rounds |\n|---|---|---|---|")
    for r in rows:
        times: dict[str, list[float]] = {kv: [] for kv in DTYPES}
        for i in range(args.rounds):
            for kv in DTYPES if i % 2 == 0 else reversed(DTYPES):
                start = time.perf_counter()
                for _ in range(args.calls):
                    _forward(engines[kv], ids[: args.cached + r], args.cached, prompt=False)
                times[kv].append((time.perf_counter() - start) / args.calls * 1e3)
        ratio = statistics.median(b / f for f, b in zip(times["float32"], times["bfloat16"]))
        print(f"| {r} | {statistics.median(times['float32']):.2f} | {statistics.median(times['bfloat16']):.2f} "
              f"| {ratio:.3f} |", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
