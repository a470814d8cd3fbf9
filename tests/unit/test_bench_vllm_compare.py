"""bench.vllm_cpu_compare's arithmetic: medians over rounds, batch 1 over its three prompts, ratios to vLLM."""
from __future__ import annotations

from bench.engine_bench import RowResult
from bench.vllm_cpu_compare import medians, scenarios, table


def test_batch_1_is_its_prompts_tokens_over_their_seconds_and_rounds_give_their_median() -> None:
    rounds = [
        [RowResult("vllm_plain", "single:a", 100, 1.0), RowResult("vllm_plain", "single:b", 100, 3.0),
         RowResult("vllm_plain", "concurrent:16", 1600, 4.0)],
        [RowResult("vllm_plain", "single:a", 100, 1.0), RowResult("vllm_plain", "single:b", 100, 1.0),
         RowResult("vllm_plain", "concurrent:16", 1600, 8.0)],
        [RowResult("vllm_plain", "single:a", 100, 2.0), RowResult("vllm_plain", "single:b", 100, 2.0),
         RowResult("vllm_plain", "concurrent:16", 1600, 2.0)],
    ]
    figures = medians(rounds)
    assert figures[("vllm_plain", "batch 1")] == 50.0  # 200/4, 200/2, 200/4
    assert figures[("vllm_plain", "concurrent:16")] == 400.0  # 400, 200, 800


def test_each_of_ours_is_set_against_vllms_row_of_the_same_method() -> None:
    figures = {("vllm_plain", "batch 1"): 50.0, ("vllm_plain", "concurrent:16"): 400.0,
               ("ours_plain@bf16", "batch 1"): 60.0, ("ours_plain@bf16", "concurrent:16"): 500.0}
    lines = table(figures, ["bf16", "int4"]).splitlines()
    assert lines[0] == "| row | batch 1 | concurrent:16 |"
    assert lines[3] == "| ours_plain@bf16 | 60.0 (1.20x) | 500.0 (1.25x) |"
    assert lines[4] == "| ours_plain@int4 | - | - |"
    assert not any("ngram" in line for line in lines)  # a method not run has no rows


def test_concurrency_1_is_batch_1() -> None:
    assert scenarios([1, 16, 64]) == ["single", "concurrent:16", "concurrent:64"]
