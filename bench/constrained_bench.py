"""Constrained decoding overhead: JSON-schema-constrained against unconstrained generation, per token,
batched, speculating and not, in one run (one engine, one process).

    python -m bench.constrained_bench                        # 16 concurrent, 128 tokens each, 3 rounds
    python -m bench.constrained_bench --concurrency 4 --tokens 16 --rounds 1   # a smoke run

Every request generates exactly --tokens tokens: unconstrained ones ignore EOS, constrained ones
follow a schema that cannot end sooner (an array with more items than fit), so both sides emit the
same number of tokens. The four rows run interleaved, round after round, and the overhead is the
median over rounds of (constrained seconds per token / unconstrained seconds per token - 1), so a
noisy machine moves both sides alike. Speculation (n-gram, adaptive) drafts different amounts for
JSON and for prose, so the speculating overhead mixes the grammar's cost with a different
acceptance; the table also reports the time spent in the grammar itself (masks, draft checks,
matcher updates) as a share of the constrained row's time, which isolates it. Target: under 10 %
at 16 concurrent.
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.workloads import ALL

SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "maxLength": 200},
        "points": {"type": "array", "items": {"type": "string", "maxLength": 120}, "minItems": 1000},
    },
    "required": ["answer", "points"],
    "additionalProperties": False,
}


@dataclass
class Row:
    constrained: bool
    speculating: bool
    seconds: float
    tokens: int
    grammar_s: float
    drafted: int
    accepted: int

    @property
    def ms_per_token(self) -> float:
        return 1000 * self.seconds / self.tokens if self.tokens else 0.0


class GrammarClock:
    """Adds up the seconds the engine spends in its matchers (wrapping the three calls the step makes)."""

    def __init__(self, engine: Any) -> None:
        self.seconds = 0.0
        matchers = engine.matchers
        matchers.mask_ = self._timed(matchers.mask_)
        matchers.valid_drafts = self._timed(matchers.valid_drafts)
        matchers.advance = self._timed(matchers.advance)

    def _timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0

        return wrapper


def _prompts(tokenizer: Any, n: int) -> list[list[int]]:
    out = []
    for i in range(n):
        messages = ALL[i % len(ALL)].messages + [{"role": "user", "content": "Answer as a JSON object."}]
        enc = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        out.append(list(enc["input_ids"] if hasattr(enc, "keys") else enc))
    return out


def _run(engine: Any, clock: GrammarClock, prompts: list[list[int]], tokens: int, constrained: bool,
         speculating: bool, tag: str) -> Row:
    from engine.grammar.constraint import json_constraint
    from engine.request import EngineRequest, SamplingOptions

    constraint = json_constraint(SCHEMA) if constrained else None
    params = SamplingOptions(max_tokens=tokens, ignore_eos=not constrained)
    requests = [EngineRequest(f"{tag}-{i}", p, params, speculation=speculating, constraint=constraint)
                for i, p in enumerate(prompts)]
    grammar_before = clock.seconds
    start = time.perf_counter()
    results = engine.generate(requests)
    seconds = time.perf_counter() - start
    emitted = sum(len(r.token_ids) for r in results.values())
    if emitted != tokens * len(prompts):
        raise RuntimeError(f"{tag}: {emitted} tokens, expected {tokens * len(prompts)}: a request ended early")
    return Row(constrained, speculating, seconds, emitted, clock.seconds - grammar_before,
               sum(r.spec.drafted for r in results.values()), sum(r.spec.accepted for r in results.values()))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128, help="tokens generated per request")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)

    from engine.config import SpeculationConfig, embedded_engine_config
    from engine.llm_engine import LLMEngine

    engine = LLMEngine.from_config(embedded_engine_config(model="smollm2-135m-instruct", speculation=SpeculationConfig()))
    clock = GrammarClock(engine)
    prompts = _prompts(engine.tokenizer, args.concurrency)
    _run(engine, clock, prompts[:2], 8, True, True, "warmup")  # builds the grammar tokenizer (about 1 s)
    _run(engine, clock, prompts[:2], 8, False, True, "warmup-free")

    rows: dict[tuple[bool, bool], list[Row]] = {}
    for r in range(args.rounds):
        for speculating in (False, True):
            for constrained in (False, True):
                row = _run(engine, clock, prompts, args.tokens, constrained, speculating, f"r{r}")
                rows.setdefault((constrained, speculating), []).append(row)
    _report(rows, args)


def _report(rows: dict[tuple[bool, bool], list[Row]], args: argparse.Namespace) -> None:
    print(f"\n{args.concurrency} concurrent, {args.tokens} tokens each, {args.rounds} round(s); medians over rounds\n")
    print("| speculation | output | ms/token | drafted | accepted | grammar time | overhead per token |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for speculating in (False, True):
        free, constrained = rows[(False, speculating)], rows[(True, speculating)]
        overhead = statistics.median(c.ms_per_token / f.ms_per_token - 1 for f, c in zip(free, constrained))
        share = statistics.median(c.grammar_s / c.seconds for c in constrained)
        mode = "on" if speculating else "off"
        print(f"| {mode} | free text | {_median_ms(free):.2f} | {free[0].drafted} | {free[0].accepted} | - | |")
        print(f"| {mode} | JSON schema | {_median_ms(constrained):.2f} | {constrained[0].drafted} |"
              f" {constrained[0].accepted} | {100 * share:.1f} % | {100 * overhead:+.1f} % |")


def _median_ms(series: list[Row]) -> float:
    return statistics.median(x.ms_per_token for x in series)


if __name__ == "__main__":
    main()
