"""What a speculative step costs and yields at batch 1, against a plain decode step (issue 16).

    python -m bench.spec_step_cost --draft-head smollm2-135m-instruct --weights bf16 --threads 1
    python -m bench.spec_step_cost --draft-head smollm2-135m-instruct --methods ngram,eagle,eagle_lookup \
        --workloads open_question,code_edit,rag --adaptive

Runs the default model on benchmark prompts (greedy, --max-new tokens), one
method after another in one process (default: plain, EAGLE, plain again), and
prints per step: target steps, tokens per step, the wall time, the time spent
proposing, and what is left for the target's step. Without --adaptive the
drafts have a fixed length k (no controller); with it the controller sizes them
as served. Plain runs bracketing a speculative one show how much the machine
drifted meanwhile: only ratios within one run mean anything on a shared machine.
Steps and tokens per step do not drift, except through the controller's k, which
follows measured step times.
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch


@dataclass
class StepCost:
    name: str
    steps: int
    tokens: int
    wall_s: float
    propose_s: float

    def row(self) -> str:
        per_step = self.wall_s * 1e3 / self.steps
        propose = self.propose_s * 1e3 / self.steps
        return (f"| {self.name} | {self.steps} | {self.tokens / self.steps:.2f} | {per_step:.1f} | {propose:.1f} "
                f"| {per_step - propose:.1f} |")


def speculation(method: str, draft_head: str, k: int, adaptive: bool):  # type: ignore[no-untyped-def]
    from engine.config import SpeculationConfig

    if method == "plain":
        return SpeculationConfig(enabled=False)
    if method == "ngram":
        return SpeculationConfig(enabled=True, method="ngram", max_draft_tokens=k, adaptive=adaptive)
    if method in ("eagle", "eagle_lookup"):
        return SpeculationConfig(enabled=True, method="eagle", draft_head=draft_head, max_draft_tokens=k,
                                 adaptive=adaptive, eagle_prompt_lookup=method == "eagle_lookup")
    raise SystemExit(f"unknown method {method!r}: plain, ngram, eagle or eagle_lookup")


def run(name: str, weights: str, workload: str, max_new: int, speculation: object) -> StepCost:
    from bench.workloads import BY_NAME
    from engine.config import embedded_engine_config
    from engine.llm_engine import LLMEngine
    from engine.request import EngineRequest, SamplingOptions

    engine = LLMEngine.from_config(embedded_engine_config(model="smollm2-135m-instruct", weights=weights,
                                                kv_cache_bytes=64 << 20, speculation=speculation))  # type: ignore[arg-type]
    ids = BY_NAME[workload].token_ids(engine.tokenizer)
    proposing = [0.0]
    proposer = engine.proposer
    if proposer is not None:
        propose = proposer.propose

        def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            try:
                return propose(*args, **kwargs)
            finally:
                proposing[0] += time.perf_counter() - t0

        proposer.propose = timed  # type: ignore[method-assign]
    engine.add_request(EngineRequest("p", ids, SamplingOptions(max_tokens=max_new, temperature=0.0, ignore_eos=True)))
    engine.step()  # the prefill, not counted
    proposing[0], steps, t0 = 0.0, 0, time.perf_counter()
    while engine.has_unfinished():
        engine.step()
        steps += 1
    return StepCost(f"{name}, {workload}", steps, max_new - 1, time.perf_counter() - t0, proposing[0])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draft-head", required=True, help="trained EAGLE head (folder or name)")
    ap.add_argument("--weights", default="fp32", choices=("fp32", "bf16", "int8", "int4"))
    ap.add_argument("--methods", default="plain,eagle,plain", help="comma-separated: plain, ngram, eagle, eagle_lookup")
    ap.add_argument("--workloads", default="open_question", help="comma-separated bench.workloads names")
    ap.add_argument("--k", type=int, default=3, help="drafts per step (the most, with --adaptive)")
    ap.add_argument("--adaptive", action="store_true", help="the adaptive controller sizes drafts, as served")
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"| {args.weights}, batch 1, {'adaptive' if args.adaptive else f'k = {args.k}'} | target steps | tokens per "
          "step | ms per step | proposing | target step |\n|---|---|---|---|---|---|", flush=True)
    for workload in args.workloads.split(","):
        for method in args.methods.split(","):
            spec = speculation(method, args.draft_head, args.k, args.adaptive)
            print(run(method, args.weights, workload, args.max_new, spec).row(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
