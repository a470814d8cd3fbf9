"""Workloads of `specstream bench`: built-in sets, datasets, lengths, seeds. No model, no server."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import workloads as base
from streams.bench.workload import LengthSpec, from_dataset, load_dataset, synthetic, take


def test_first_requests_are_the_bench_workload_prompts() -> None:
    reqs = take(synthetic("mixed", LengthSpec(), seed=0), 3)
    assert [r.workload for r in reqs] == ["chat", "code", "rag"]
    assert list(reqs[0].messages) == base.OPEN_QUESTION.messages
    assert list(reqs[1].messages) == base.CODE_EDIT.messages
    assert list(reqs[2].messages) == base.RAG_ANSWER.messages


@pytest.mark.parametrize("name", ["chat", "code", "rag", "mixed"])
def test_the_same_seed_gives_the_same_requests_each_with_its_own_sampling_seed(name: str) -> None:
    lengths = LengthSpec(output_len=64, output_len_jitter=0.2, input_len=300, input_len_jitter=0.3)
    a = take(synthetic(name, lengths, seed=5), 12)
    b = take(synthetic(name, lengths, seed=5), 12)
    c = take(synthetic(name, lengths, seed=6), 12)
    assert a == b
    assert a != c
    assert len({r.seed for r in a}) == len(a)  # each request has its own sampling seed


def test_the_prompts_of_one_workload_vary_from_request_to_request() -> None:
    reqs = take(synthetic("chat", LengthSpec(), seed=1), 10)
    assert len({json.dumps(r.messages) for r in reqs}) >= 6


def test_output_length_jitter_stays_within_its_bounds_and_no_jitter_is_fixed() -> None:
    reqs = take(synthetic("chat", LengthSpec(output_len=100, output_len_jitter=0.2), seed=2), 200)
    lens = [r.max_tokens for r in reqs]
    assert min(lens) >= 80 and max(lens) <= 120 and len(set(lens)) > 10
    fixed = take(synthetic("chat", LengthSpec(output_len=16), seed=2), 5)
    assert {r.max_tokens for r in fixed} == {16}


@pytest.mark.parametrize("name", ["chat", "code", "rag"])
def test_input_len_steers_prompt_length(name: str) -> None:
    short = take(synthetic(name, LengthSpec(input_len=100), seed=0), 6)
    long = take(synthetic(name, LengthSpec(input_len=1200), seed=0), 6)
    mean = lambda rs: sum(r.approx_prompt_tokens for r in rs) / len(rs)  # noqa: E731
    assert mean(long) > 1.5 * mean(short)


def test_bad_lengths_rejected() -> None:
    with pytest.raises(ValueError):
        LengthSpec(output_len=0)
    with pytest.raises(ValueError):
        LengthSpec(output_len_jitter=1.5)
    with pytest.raises(ValueError):
        next(synthetic("poetry", LengthSpec(), seed=0))


def test_a_dataset_of_prompts_messages_and_conversations_is_cycled_reproducibly(tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    lines = [
        {"prompt": "Once upon a time"},
        {"messages": [{"role": "user", "content": "Hello?"}], "max_tokens": 7},
        {"conversations": [{"from": "human", "value": "Tell me a joke."}, {"from": "gpt", "value": "No."}]},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n# comment\n", encoding="utf-8")
    rows = load_dataset(path)
    assert len(rows) == 3
    reqs = take(from_dataset(rows, LengthSpec(output_len=32), seed=3), 6)
    assert sum(1 for r in reqs if r.prompt == "Once upon a time") == 2  # cycles
    assert all(r.max_tokens == 7 for r in reqs if r.messages and r.messages[0]["content"] == "Hello?")
    assert reqs == take(from_dataset(rows, LengthSpec(output_len=32), seed=3), 6)
    ordered = take(from_dataset(rows, LengthSpec(), seed=3, shuffle=False), 3)
    assert ordered[0].prompt == "Once upon a time" and ordered[2].messages[0]["content"] == "Tell me a joke."


@pytest.mark.parametrize("line", ['{"text": 1}', "not json", '{"messages": []}', '{"prompt": "x", "max_tokens": 0}'])
def test_bad_dataset_lines_name_the_line(tmp_path: Path, line: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "ok"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        load_dataset(path)
