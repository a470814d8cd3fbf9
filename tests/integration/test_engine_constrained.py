"""Constrained decoding through the whole LLMEngine on the real model: outputs parse and validate,
constrained and free requests share batches, and speculation changes nothing, token for token
(greedy and seeded sampling), whatever the drafts the grammar cut."""
from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from engine.config import SpeculationConfig, embedded_engine_config
from engine.grammar.constraint import json_constraint
from engine.llm_engine import LLMEngine
from engine.request import EngineRequest, SamplingOptions

pytestmark = pytest.mark.model

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
CASES = [  # (prompt, schema, sampling)
    ("Describe Ada Lovelace as JSON.", PERSON, SamplingOptions(max_tokens=48)),
    ("Give a person as JSON.", PERSON, SamplingOptions(max_tokens=48, temperature=0.8, seed=7)),
    ("Answer with a JSON object {\"answer\": ...}: what is 2+2?", None, SamplingOptions(max_tokens=64, temperature=0.7, seed=3)),
]


def engine(speculate: bool, method: str = "ngram") -> LLMEngine:
    spec = SpeculationConfig(enabled=speculate, method=method, max_draft_tokens=4, adaptive=False)
    return LLMEngine.from_config(embedded_engine_config(kv_cache_bytes=1 << 27, speculation=spec))


def prompt(eng: LLMEngine, text: str) -> list[int]:
    messages = [{"role": "user", "content": text}]
    return list(eng.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"])


def run(eng: LLMEngine, tag: str = "") -> dict[str, Any]:
    reqs = [
        EngineRequest(f"{tag}c{i}", prompt(eng, text), sampling, constraint=json_constraint(schema))
        for i, (text, schema, sampling) in enumerate(CASES)
    ]
    reqs.append(EngineRequest(f"{tag}free", prompt(eng, "What is Kafka?"), SamplingOptions(max_tokens=16)))
    return {rid.removeprefix(tag): out for rid, out in eng.generate(reqs).items()}


@pytest.fixture(scope="module")
def without_speculation() -> dict[str, Any]:
    return run(engine(speculate=False))


@pytest.fixture(scope="module")
def with_speculation() -> dict[str, Any]:
    return run(engine(speculate=True))


def test_constrained_outputs_parse_and_validate_against_their_schemas(without_speculation: dict[str, Any]) -> None:
    for i, (_, schema, _) in enumerate(CASES):
        out = without_speculation[f"c{i}"]
        assert out.finish_reason == "stop", out.text
        value = json.loads(out.text)
        jsonschema.validate(value, schema or {"type": "object"})


def test_an_unconstrained_request_in_the_same_batch_is_free_text(without_speculation: dict[str, Any]) -> None:
    assert not without_speculation["free"].text.lstrip().startswith("{")


def test_speculation_is_lossless_under_constraints(
    without_speculation: dict[str, Any], with_speculation: dict[str, Any]
) -> None:
    for rid, out in without_speculation.items():
        assert with_speculation[rid].token_ids == out.token_ids, rid
    constrained = [with_speculation[f"c{i}"] for i in range(len(CASES))]
    assert sum(o.spec.drafted for o in constrained) > 0 and sum(o.spec.accepted for o in constrained) > 0


def test_suffix_decoding_from_earlier_json_answers_is_lossless_under_constraints(
    without_speculation: dict[str, Any]
) -> None:
    """The same requests twice on one engine: the second round drafts from the first round's JSON answers."""
    eng = engine(speculate=True, method="suffix")
    run(eng, "first-")
    again = run(eng, "again-")
    for rid, out in without_speculation.items():
        assert again[rid].token_ids == out.token_ids, rid
    constrained = [again[f"c{i}"] for i in range(len(CASES))]
    drafted, accepted = sum(o.spec.drafted for o in constrained), sum(o.spec.accepted for o in constrained)
    assert accepted >= 0.8 * drafted > 0
