"""Prompt lookup replayed offline over a greedy answer: which draft length pays, under a step-cost model (issue 17).

    python -m bench.lookup_replay                                   # RAG, int4, llama.cpp's Q4_0 file if built
    python -m bench.lookup_replay --workload code_edit --step-ms 5.8 --row-ms 0.8 --max-new 128

Generates the workload's greedy answer once without speculation, then serves it again with prompt lookup and
the adaptive controller (as served) and counts that run's steps, drafts and accepted drafts. Then, for each
fixed draft length k and smallest n-gram, it feeds the n-gram proposer (engine/speculative/ngram.py) the prompt plus the
answer so far, accepts drafts while they equal the answer (the greedy verifier's rule), and models the decode
time as steps x --step-ms + drafts x --row-ms. Those two come from a loop of timed steps on the target machine
(54e26a1:docs/benchmarks.md, "What a verification row costs"); the counts do not depend on the machine.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from bench.llama_cpp_compare import made_file
from engine.request import SamplingOptions
from engine.speculative.ngram import NgramProposer
from engine.speculative.proposer import ProposalInput


@dataclass(frozen=True)
class Replay:
    name: str
    steps: int
    drafted: int
    accepted: int

    def row(self, tokens: int, step_ms: float, row_ms: float) -> str:
        ms = self.steps * step_ms + self.drafted * row_ms
        return f"| {self.name} | {self.steps} | {self.drafted} | {self.accepted} | {tokens / ms * 1e3:.1f} |"


def replay(prompt: list[int], answer: list[int], k: int, ngram_min: int) -> Replay:
    """Steps, drafts and accepted drafts of prompt lookup with k drafts a step over a known greedy answer."""
    proposer = NgramProposer(ngram_min, 4)
    greedy = SamplingOptions(temperature=0.0)
    done = steps = drafted = accepted = 0
    while done < len(answer):
        context = ProposalInput(seq_id="replay", token_ids=prompt + answer[:done], params=greedy)
        draft = proposer.propose([context], [k])[0].tokens
        hits = 0
        while hits < len(draft) and done + hits < len(answer) and draft[hits] == answer[done + hits]:
            hits += 1
        steps, drafted, accepted, done = steps + 1, drafted + len(draft), accepted + hits, done + hits + 1
    return Replay(f"k = {k}, n-grams {ngram_min}..4", steps, drafted, accepted)


def served(model: str, weights: str, workload: str, max_new: int) -> tuple[list[int], list[int], Replay]:
    """(prompt and the prefill's token, the decoded rest of the greedy answer, prompt lookup's counts as served)."""
    from bench.workloads import BY_NAME
    from engine.config import SpeculationConfig, embedded_engine_config
    from engine.llm_engine import LLMEngine
    from engine.request import EngineRequest

    params = SamplingOptions(max_tokens=max_new, temperature=0.0, ignore_eos=True)
    runs = []
    for lookup in (False, True):
        engine = LLMEngine.from_config(embedded_engine_config(
            model=model, weights=weights, speculation=SpeculationConfig(enabled=lookup, method="ngram")))
        prompt = BY_NAME[workload].token_ids(engine.tokenizer)
        engine.add_request(EngineRequest("replay", prompt, params))
        answer = [t for out in engine.step() for t in out.token_ids]  # the prefill's token
        steps = drafted = accepted = 0
        while engine.has_unfinished():
            for out in engine.step():
                answer += out.token_ids
                drafted, accepted = drafted + out.spec.drafted, accepted + out.spec.accepted
            steps += 1
        runs.append((prompt, answer, Replay("adaptive controller, as served", steps, drafted, accepted)))
    (prompt, plain, _), (_, speculative, as_served) = runs
    if speculative != plain:
        raise SystemExit("prompt lookup changed the greedy answer: the verifier is not lossless here")
    return prompt + plain[:1], plain[1:], as_served  # the prefill's token is not a decode step's


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="rag", help="a bench.workloads name")
    q4_0 = made_file("Q4_0")
    ap.add_argument("--model", default=str(q4_0) if q4_0.exists() else "smollm2-135m-instruct")
    ap.add_argument("--weights", default="int4", choices=("fp32", "bf16", "int8", "int4"))
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--step-ms", type=float, default=5.8, help="a decode step's time, ms")
    ap.add_argument("--row-ms", type=float, default=0.8, help="what each draft row adds to a step, ms")
    args = ap.parse_args(argv)
    context, answer, as_served = served(args.model, args.weights, args.workload, args.max_new)
    print(f"{args.workload}: {len(answer)} tokens decoded after the prefill; {args.model} ({args.weights})")
    print("| policy | steps | drafts | accepted | modelled tok/s |\n|---|---|---|---|---|")
    plain = Replay("no drafts", len(answer), 0, 0)
    policies = [replay(context, answer, k, n) for k in (1, 2, 3, 4, 6, 8) for n in (1, 2, 3)]
    for r in (plain, as_served, *policies):
        print(r.row(len(answer), args.step_ms, args.row_ms))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
