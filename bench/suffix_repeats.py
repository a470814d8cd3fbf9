"""Suffix decoding on a repetitive structured workload: similar JSON extractions, one request after another.

    python -m bench.suffix_repeats --weights int4 --methods plain,ngram,suffix --requests 12

Each method runs in a fresh engine (the default model), so suffix decoding starts with an empty index of past
outputs and warms as the requests finish: the later requests draft from the earlier answers' shape. Prints, per
method, the target forwards (deterministic: the measure to trust on a shared machine), drafted and accepted
tokens, and the wall time (which only means something on a quiet one). The text is the same under every method;
the run checks it.
"""
from __future__ import annotations

import argparse
import time
from typing import Any

CITIES = ("Paris", "Lyon", "Oslo", "Rome", "Porto", "Bern", "Graz", "Turin", "Ghent", "Cork", "Split", "Riga")


def order(i: int) -> str:
    """The i-th request: the same instruction over a different record (deterministic)."""
    return (f"Extract the order as JSON with keys id, customer, city, items, status. Order #{1000 + i}: customer "
            f"Ana {chr(65 + i % 26)}. from {CITIES[i % len(CITIES)]} bought {i % 4 + 1} lamps; shipped.")


def run(method: str, weights: str, requests: int, max_new: int) -> tuple[dict[str, Any], list[list[int]]]:
    from engine.config import SpeculationConfig, embedded_engine_config
    from engine.llm_engine import LLMEngine
    from engine.request import EngineRequest, SamplingOptions

    spec = (SpeculationConfig(enabled=False) if method == "plain"
            else SpeculationConfig(enabled=True, method=method, max_draft_tokens=8))
    engine = LLMEngine.from_config(embedded_engine_config(model="smollm2-135m-instruct", weights=weights,
                                                          kv_cache_bytes=1 << 27, speculation=spec))
    texts: list[list[int]] = []
    drafted = accepted = 0
    start, forwards = time.perf_counter(), engine.num_forwards
    for i in range(requests):
        messages = [{"role": "user", "content": order(i)}]
        prompt = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        out = engine.generate([EngineRequest(f"r{i}", list(prompt["input_ids"]), SamplingOptions(max_tokens=max_new))])
        texts.append(out[f"r{i}"].token_ids)
        drafted += out[f"r{i}"].spec.drafted
        accepted += out[f"r{i}"].spec.accepted
    row = {"method": method, "forwards": engine.num_forwards - forwards, "tokens": sum(map(len, texts)),
           "drafted": drafted, "accepted": accepted, "wall_s": time.perf_counter() - start}
    return row, texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights", default="int4")
    parser.add_argument("--methods", default="plain,ngram,suffix")
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--max-new", type=int, default=64)
    args = parser.parse_args()
    print("| method | target forwards | tokens | drafted | accepted | wall s |\n|---|---|---|---|---|---|")
    first: list[list[int]] | None = None
    for method in args.methods.split(","):
        row, texts = run(method, args.weights, args.requests, args.max_new)
        if first is not None and texts != first:
            raise SystemExit(f"{method}: the text differs from {args.methods.split(',')[0]}'s")
        first = first or texts
        print(f"| {row['method']} | {row['forwards']} | {row['tokens']} | {row['drafted']} | {row['accepted']} "
              f"| {row['wall_s']:.1f} |")


if __name__ == "__main__":
    main()
