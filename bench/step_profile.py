"""Where one batch-1 decode step's time goes: the linears against everything else (issue 17).

    python -m bench.step_profile                    # int4, 64 decode steps of the open question
    python -m bench.step_profile --weights fp32 --steps 128 --threads 2

Runs the default model plainly (no speculation) on one benchmark prompt, then
profiles `--steps` decode steps with torch.profiler and splits each step's
wall time into: the linears' kernels, attention (SDPA and the KV write), the
elementwise ops of norms, rotary, activation and residuals, the LM head's
sampling, other ops, and what no op accounts for (Python, dispatch). Per step,
in ms; only ratios between rows of one run mean anything on a shared machine.
"""
from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile, record_function

LINEAR_OPS = ("_weight_int4pack_mm", "_weight_int8pack_mm", "mkldnn::_linear_pointwise", "aten::addmm", "aten::mm")
ATTENTION_OPS = ("scaled_dot_product", "aten::index_copy_")
SAMPLING_OPS = ("softmax", "multinomial", "argmax", "sort", "topk", "cumsum", "exponential")
ELEMENTWISE_OPS = ("aten::mul", "aten::add", "aten::cat", "aten::neg", "aten::pow", "aten::mean", "aten::rsqrt",
                   "aten::silu", "aten::copy_", "aten::_to_copy", "aten::index", "aten::sub")  # fmt: skip


def category(op: str) -> str:
    for name, keys in (("linears", LINEAR_OPS), ("attention", ATTENTION_OPS), ("sampling", SAMPLING_OPS)):
        if any(k in op for k in keys):
            return name
    return "elementwise" if op.startswith(ELEMENTWISE_OPS) else "other ops"


def _engine(weights: str):  # type: ignore[no-untyped-def]
    from engine.config import embedded_engine_config
    from engine.llm_engine import LLMEngine

    return LLMEngine.from_config(embedded_engine_config(model="smollm2-135m-instruct", weights=weights, kv_cache_bytes=64 << 20))


def profile_steps(weights: str, steps: int, workload: str) -> tuple[dict[str, float], float]:
    """(ms per decode step by category, plus "step wall" and "no op (Python, dispatch)"; op calls per step).

    The op calls (nested ones included) do not depend on the machine's load: a count of dispatches cut.
    """
    from bench.workloads import BY_NAME
    from engine.request import EngineRequest, SamplingOptions

    engine = _engine(weights)
    ids = BY_NAME[workload].token_ids(engine.tokenizer)
    engine.add_request(EngineRequest("p", ids, SamplingOptions(max_tokens=steps + 24, temperature=0.0, ignore_eos=True)))
    for _ in range(16):  # the prefill, then warm decodes
        engine.step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            with record_function("step"):
                engine.step()
        wall = time.perf_counter() - t0
    out: dict[str, float] = defaultdict(float)
    calls = 0
    for ev in prof.key_averages():
        if ev.key != "step":
            out[category(ev.key)] += ev.self_cpu_time_total / 1e3 / steps
            calls += ev.count
    out["no op (Python, dispatch)"] = wall * 1e3 / steps - sum(out.values())
    out["step wall"] = wall * 1e3 / steps
    return dict(out), calls / steps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", default="int4")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--workload", default="open_question")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows, calls = profile_steps(args.weights, args.steps, args.workload)
    print(f"| {args.weights}, batch 1, {args.steps} decode steps | ms per step | share |\n|---|---|---|")
    for name, ms in sorted(rows.items(), key=lambda kv: -kv[1]):
        print(f"| {name} | {ms:.2f} | {ms / rows['step wall']:.0%} |")
    print(f"\nop calls per step (nested included): {calls:.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
