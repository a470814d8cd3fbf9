"""Quality and memory of each weight format against fp32, on the default model (or another known one).

    python -m bench.quant_quality                 # fp32, bf16, int8, int4; 128 new tokens
    python -m bench.quant_quality --max-new 32    # quicker
    python -m bench.quant_quality --formats fp32,int4,int4@float32   # int4 with an fp32 KV cache too
    python -m bench.quant_quality --model gemma-3-270m --formats fp32,gguf,int4,int8   # its Q4_K_M file

Reports, per format (engine.weights; "@float32" / "@bfloat16" sets engine.kv_cache_dtype, else auto: bfloat16
K and V beside bf16/int8/int4 weights):
* mean negative log-likelihood (and perplexity) of a fixed text: the benchmark's
  RAG context and code function, teacher-forced through the model;
* greedy agreement with fp32 over the benchmark prompts: the common prefix
  and the share of positions where the tokens are the same;
* resident weight bytes, with and without the bf16 copy for wide steps, and
  the bytes a batch-1 decode step reads (the quantized kernels' weights).
None of these depend on the machine's load, so this runs on a busy machine.
The NLL runs every row on the quantized kernel (no bf16 copy): the numbers are
the quantized model's own.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import torch

from bench.result_files import default_out
from bench.workloads import ALL, CODE_FUNCTION, RAG_CONTEXT

FORMATS = ("fp32", "bf16", "int8", "int4", "int4@float32")
MODEL = "smollm2-135m-instruct"


def _engine(spec: str, wide: bool, model: str = MODEL) -> Any:
    from engine.config import SpeculationConfig, embedded_engine_config
    from engine.llm_engine import LLMEngine

    fmt, _, kv = spec.partition("@")
    cfg = embedded_engine_config(
        model=model,
        weights=fmt,
        kv_cache_dtype=kv or "auto",
        prepack_weights=wide,
        kv_cache_bytes=256 << 20,
        speculation=SpeculationConfig(enabled=False),
    )
    return LLMEngine.from_config(cfg)


@torch.inference_mode()
def mean_nll(engine: Any, token_ids: list[int]) -> float:
    """Teacher-forced mean NLL (nats/token) of token_ids[1:] given their prefixes, one prefill."""
    from engine.kv_cache import KVCache
    from engine.model import AttentionMetadata, SeqAttention

    model = engine.model
    n = len(token_ids)
    cfg = model.cfg
    cache = KVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, n, engine.kv_cache.dtype, model.device)
    ids = torch.tensor(token_ids)
    attn = AttentionMetadata([SeqAttention(0, n, 0, n, prompt=True)], torch.arange(n), cache)
    hidden = model(ids, torch.arange(n), attn)  # [n, hidden]
    logits = model.compute_logits(hidden[:-1])  # [n - 1, vocab]
    return float(torch.nn.functional.cross_entropy(logits, ids[1:]))


def greedy(engine: Any, max_new: int) -> dict[str, list[int]]:
    from engine.request import EngineRequest, SamplingOptions

    out = {}
    for w in ALL:
        ids = w.token_ids(engine.tokenizer)
        params = SamplingOptions(max_tokens=max_new, temperature=0.0, ignore_eos=True)
        out[w.name] = engine.generate([EngineRequest(w.name, ids, params)])[w.name].token_ids
    return out


def agreement(ours: list[int], ref: list[int]) -> tuple[int, float]:
    """(common prefix length, share of positions with the same token)."""
    prefix = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), min(len(ours), len(ref)))
    same = sum(a == b for a, b in zip(ours, ref)) / max(len(ref), 1)
    return prefix, same


def decode_step_bytes(model: Any) -> int:
    """Weight bytes a batch-1 decode step reads: every linear's narrow kernel and the LM head."""
    from engine.quant.linear import Bf16Linear, QuantizedLinear, nbytes

    read: list[torch.Tensor] = []
    for m in model.modules():
        if isinstance(m, QuantizedLinear):
            read += m.narrow.tensors()
        elif isinstance(m, Bf16Linear):
            read += m.tensors()
        elif isinstance(m, torch.nn.Linear):
            read.append(m.weight)
    if model.lm_head is None and model.head_matmul is None:  # fp32 tied head: the embedding matrix
        read.append(model.embed_tokens.weight)
    return nbytes(read)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--model", default=MODEL, help="a known model name (engine.model)")
    ap.add_argument("--out", default=default_out("quant_quality"))
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))

    from engine.quant.apply import weight_bytes

    rows: dict[str, dict[str, Any]] = {}
    ref: dict[str, list[int]] = {}
    for fmt in args.formats.split(","):
        print(f"  {fmt} ...", file=sys.stderr, flush=True)
        lean = _engine(fmt, wide=False, model=args.model)
        text = lean.tokenizer(RAG_CONTEXT + "\n\n" + CODE_FUNCTION)["input_ids"][:1024]
        nll = mean_nll(lean, text)
        kv = str(lean.kv_cache.dtype).removeprefix("torch.")
        row: dict[str, Any] = {"format": lean.weight_format, "kv": kv, "nll": nll, "ppl": math.exp(nll)}
        row["weights_mib"] = weight_bytes(lean.model) / 2**20
        row["decode_step_read_mib"] = decode_step_bytes(lean.model) / 2**20
        del lean
        wide = _engine(fmt, wide=True, model=args.model)
        row["weights_with_wide_copy_mib"] = weight_bytes(wide.model) / 2**20
        tokens = greedy(wide, args.max_new)
        if fmt == "fp32":
            ref = tokens
        row["agreement"] = {name: agreement(tokens[name], ref.get(name, tokens[name])) for name in tokens}
        rows[fmt] = row

    from engine.model_ref import KNOWN_MODELS

    gguf_mib = KNOWN_MODELS[args.model].locate().stat().st_size / 2**20
    lines = [
        f"Fixed text: {len(text)} tokens (RAG context + code function). GGUF file: {gguf_mib:.0f} MiB.",
        "",
        "| weights | KV | mean NLL | ppl | ΔNLL vs fp32 | resident MiB (x GGUF) | + bf16 wide copy MiB "
        "| read per decode step MiB " + "".join(f"| {w.name}: prefix / same " for w in ALL) + "|",
        "|---|---|---|---|---|---|---|---" + "|---" * len(ALL) + "|",
    ]
    base = rows.get("fp32", {}).get("nll", float("nan"))
    for fmt, r in rows.items():
        agree = "".join(f"| {p} / {s:.0%} " for p, s in r["agreement"].values())
        lines.append(
            f"| {fmt} ({r['format']}) | {r['kv']} | {r['nll']:.4f} | {r['ppl']:.2f} | {r['nll'] - base:+.4f} "
            f"| {r['weights_mib']:.0f} ({r['weights_mib'] / gguf_mib:.2f}x) | {r['weights_with_wide_copy_mib']:.0f} "
            f"| {r['decode_step_read_mib']:.0f} {agree}|"
        )
    table = "\n".join(lines)
    print(table)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": args.model, "max_new": args.max_new, "rows": rows, "table": table}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
