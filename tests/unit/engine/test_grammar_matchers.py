"""The grammar side of constrained decoding on the real tokenizer: the masks allow exactly what the
grammar allows, drafts the grammar refuses are found, the draft rows of a step are masked as if
the drafts had been emitted, and masking leaves the matcher where it was (rejected drafts roll back)."""
from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from engine.grammar.bitmask import allowed_tokens, bitmask_words
from engine.grammar.constraint import ConstraintError, ToolFunction, check_schema, json_constraint, tool_calls_constraint
from engine.grammar.matchers import ConstrainedRows, Matchers
from engine.model_text import load_tokenizer
from engine.request import RequestRejected

VOCAB = 49152
EOS = 2  # <|im_end|>
CITY = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Rome"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def matchers(tokenizer: Any) -> Matchers:
    return Matchers(tokenizer, VOCAB, {EOS})


def ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def allowed_after(matchers: Matchers, matcher: Any, drafts: list[int]) -> list[torch.Tensor]:
    """The allowed-token sets of the 1 + len(drafts) rows of one sequence."""
    logits = torch.zeros(1 + len(drafts), VOCAB)
    matchers.mask_(logits, [ConstrainedRows(matcher, 0, drafts)])
    return [row != float("-inf") for row in logits]


def test_a_json_schema_mask_allows_only_the_schemas_next_tokens(matchers: Matchers, tokenizer: Any) -> None:
    m = matchers.new(json_constraint(CITY))
    matchers.advance(m, ids(tokenizer, '{"city": "'))
    allowed = allowed_after(matchers, m, [])[0]
    texts = {tokenizer.decode([t]) for t in allowed.nonzero().flatten().tolist()}
    assert texts and all("Paris".startswith(t) or "Rome".startswith(t) for t in texts)
    assert not allowed[EOS]


def test_eos_is_the_only_token_once_the_value_is_complete(matchers: Matchers, tokenizer: Any) -> None:
    m = matchers.new(json_constraint(CITY))
    matchers.advance(m, ids(tokenizer, '{"city": "Rome", "days": 3}'))
    allowed = allowed_after(matchers, m, [])[0]
    assert allowed.nonzero().flatten().tolist() == [EOS]


def test_draft_rows_are_masked_as_if_the_drafts_were_emitted_and_the_matcher_does_not_move(
    matchers: Matchers, tokenizer: Any
) -> None:
    text = ids(tokenizer, '{"city": "Paris", "days": 5}')
    m = matchers.new(json_constraint(CITY))
    rows = allowed_after(matchers, m, text[:4])
    for i in range(5):  # row i: the state after text[:i], built step by step on a fresh matcher
        fresh = matchers.new(json_constraint(CITY))
        matchers.advance(fresh, text[:i])
        assert torch.equal(rows[i], allowed_after(matchers, fresh, [])[0])
    assert torch.equal(allowed_after(matchers, m, [])[0], rows[0])  # masking rolled the drafts back


def test_rows_of_unconstrained_sequences_in_the_same_batch_are_untouched(matchers: Matchers) -> None:
    logits = torch.randn(4, VOCAB)
    before = logits.clone()
    m = matchers.new(json_constraint(CITY))
    matchers.mask_(logits, [ConstrainedRows(m, 2, [])])
    assert torch.equal(logits[[0, 1, 3]], before[[0, 1, 3]])
    assert torch.isinf(logits[2]).sum() > VOCAB - 100


def test_tokens_emitted_after_the_grammars_end_are_skipped(matchers: Matchers, tokenizer: Any) -> None:
    m = matchers.new(json_constraint(CITY))
    matchers.advance(m, ids(tokenizer, '{"city": "Rome", "days": 3}') + [EOS] + ids(tokenizer, "\n"))
    assert m.is_stopped() and not m.is_error()


def test_valid_drafts_counts_the_prefix_the_grammar_accepts(matchers: Matchers, tokenizer: Any) -> None:
    m = matchers.new(json_constraint(CITY))
    good = ids(tokenizer, '{"city": "Rome"')
    assert Matchers.valid_drafts(m, good + ids(tokenizer, " nonsense")) == len(good)
    assert Matchers.valid_drafts(m, []) == 0


def test_rollback_after_rejected_drafts_continues_from_the_accepted_prefix(matchers: Matchers, tokenizer: Any) -> None:
    m = matchers.new(json_constraint(CITY))
    text = ids(tokenizer, '{"city": "Rome", "days": 2}')
    allowed_after(matchers, m, text[:6])  # a step with six drafts...
    matchers.advance(m, text[:3])  # ...of which two were accepted, plus the target's own token
    matchers.advance(m, text[3:])
    assert m.is_accepting()


def test_tool_call_grammar_required_starts_with_a_call_and_auto_also_allows_text(
    matchers: Matchers, tokenizer: Any
) -> None:
    tools = [ToolFunction("get_weather", CITY), ToolFunction("noop", {"type": "object", "properties": {}})]
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 1}}\n</tool_call>'
    required = matchers.new(tool_calls_constraint(tools, "required", parallel=False))
    assert Matchers.valid_drafts(required, ids(tokenizer, "Hello")) == 0
    assert Matchers.valid_drafts(required, ids(tokenizer, call)) == len(ids(tokenizer, call))
    auto = matchers.new(tool_calls_constraint(tools, "auto", parallel=False))
    assert Matchers.valid_drafts(auto, ids(tokenizer, "Hello there")) == len(ids(tokenizer, "Hello there"))
    # Text never holds a tag, opening or closing (a call written without its opening tag, say).
    stray = ids(tokenizer, '{"name": "noop", "arguments": {}}\n</tool_call>')
    assert Matchers.valid_drafts(auto, stray) < len(stray)


def test_a_named_function_is_called_exactly_once_even_with_parallel_calls_allowed(
    matchers: Matchers, tokenizer: Any
) -> None:
    tools = [ToolFunction("get_weather", CITY), ToolFunction("noop", {"type": "object", "properties": {}})]
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 1}}\n</tool_call>'
    named = matchers.new(tool_calls_constraint(tools, "noop", parallel=True))
    assert Matchers.valid_drafts(named, ids(tokenizer, call)) < len(ids(tokenizer, call))
    one = ids(tokenizer, '<tool_call>\n{"name": "noop", "arguments": {}}\n</tool_call>')
    matchers.advance(named, one)
    [allowed] = allowed_after(matchers, named, [])
    assert allowed.nonzero().flatten().tolist() == [EOS]  # no second call: the answer ends


def test_required_with_parallel_calls_allows_several_calls(matchers: Matchers, tokenizer: Any) -> None:
    tools = [ToolFunction("noop", {"type": "object", "properties": {}})]
    two = ids(tokenizer, "\n".join(['<tool_call>\n{"name": "noop", "arguments": {}}\n</tool_call>'] * 2))
    required = matchers.new(tool_calls_constraint(tools, "required", parallel=True))
    assert Matchers.valid_drafts(required, two) == len(two)


def test_bad_schemas_are_refused_with_the_reason() -> None:
    with pytest.raises(ConstraintError, match="invalid JSON schema"):
        check_schema({"type": 5})
    with pytest.raises(ConstraintError, match="unsupported JSON schema"):
        check_schema({"type": "string", "format": "no-such-format"})
    with pytest.raises(ConstraintError, match="no tool is named 'x'"):
        tool_calls_constraint([ToolFunction("f", {"type": "object"})], "x", parallel=False)
    check_schema(CITY)


def test_a_grammar_that_does_not_compile_is_a_rejected_request(matchers: Matchers) -> None:
    from engine.grammar.constraint import Constraint

    with pytest.raises(RequestRejected):
        matchers.new(Constraint("start: %json {\"type\": \"nonsense\"}"))


def test_bitmask_unpacks_bit_j_of_word_w_as_token_32w_plus_j() -> None:
    mask = torch.zeros(2, bitmask_words(70), dtype=torch.int32)
    mask[0, 0] = 1 << 3
    mask[0, 1] = (1 << 12) - (1 << 31)  # tokens 44 and 63: the sign bit is a token too
    mask[0, 2] = 1 << 5  # token 69
    mask[1] = -1
    allowed = allowed_tokens(mask, 70)
    assert allowed[0].nonzero().flatten().tolist() == [3, 44, 63, 69]
    assert allowed[1].all() and allowed.shape == (2, 70)
    assert json.dumps(CITY)  # the schema used above is plain JSON
