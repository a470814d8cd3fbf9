"""bench.suffix_bench's table: each side's methods against that side's plain decoding."""
from __future__ import annotations

from bench.suffix_bench import Scenario, report


def test_vllms_methods_are_set_against_vllms_plain_and_ours_against_ours() -> None:
    def run(tokens_per_s: float, answer: list[int]) -> list[Scenario]:
        return [Scenario("batch1", new_tokens=int(tokens_per_s), seconds=1.0, tokens={"r": answer})]

    results = {"plain": run(100, [1, 2]), "suffix": run(150, [1, 2]),
               "vllm_plain": run(40, [1, 3]), "vllm_suffix": run(100, [1, 3])}
    rows = report(results).splitlines()[2:]
    assert rows[1] == "| suffix | batch1 | 150.0 | 1.50 | 0 | 0 | yes |"
    assert rows[3] == "| vllm_suffix | batch1 | 100.0 | 2.50 | 0 | 0 | yes |"  # vLLM's own plain, not ours
