"""What a constrained request must produce, as one llguidance grammar (its Lark dialect).

Two shapes of output are built here:

* JSON (`response_format`): one JSON value matching a schema (any object for `json_object`);
* tool calls in the Hermes format the larger SmolLM2 and Qwen models use, one call per tag:

      <tool_call>
      {"name": "get_weather", "arguments": {"city": "Paris"}}
      </tool_call>

  `required` and a named function start with a call; `auto` lets the model choose between plain text
  (which may contain neither `<tool_call>` nor `</tool_call>`) and calls. Several calls are separated by a newline, and
  allowed only with parallel tool calls and `auto` or `required`: a named function is called once.

JSON is compact (`", "` and `": "`, no other whitespace): a small model given free whitespace may
spend its whole budget on newlines. Nothing here needs a tokenizer or torch, so the edge validates
schemas with the same code the engine compiles them with.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema
import jsonschema.exceptions
from llguidance import LLMatcher

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
# llguidance's JSON compiler options: compact separators, no free whitespace.
_COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# Any text that holds neither tag (llguidance regexes have & and ~): an `auto` answer in text never shows tag text.
_TEXT = r"/(.|\n)+/ & ~/(.|\n)*<\/?tool_call>(.|\n)*/"


class ConstraintError(ValueError):
    """A schema that is not valid JSON Schema, or uses what the grammar compiler does not support."""


@dataclass(frozen=True)
class Constraint:
    """The grammar a request's output must match: llguidance Lark text, ready for `LLMatcher`."""

    grammar: str


@dataclass(frozen=True)
class ToolFunction:
    """One callable function: its name and the JSON schema of its arguments."""

    name: str
    parameters: dict[str, Any]


def check_schema(schema: dict[str, Any]) -> None:
    """Raise ConstraintError if `schema` is not a valid JSON Schema or uses features we cannot enforce."""
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.exceptions.SchemaError as error:
        raise ConstraintError(f"invalid JSON schema: {error.message}") from None
    try:
        grammar = LLMatcher.grammar_from_json_schema(_compact(schema))
    except ValueError as error:  # what llguidance raises for input it cannot even read
        raise ConstraintError(f"unsupported JSON schema: {error}") from None
    _check_grammar(grammar)


def json_constraint(schema: dict[str, Any] | None) -> Constraint:
    """One JSON value matching `schema`; None: any JSON object (`json_object`)."""
    schema = {"type": "object"} if schema is None else schema
    return _checked(f"start: value\nvalue: %json {json.dumps(_compact(schema))}\n")


def tool_calls_constraint(tools: Sequence[ToolFunction], choice: str, parallel: bool) -> Constraint:
    """Tool calls in the Hermes format.

    choice: "auto" (text or calls), "required" (at least one call), or a function's name (exactly one
    call of that function). parallel: more than one call allowed (auto and required only).
    """
    if not tools:
        raise ConstraintError("tool calls need at least one tool")
    callable_ = list(tools) if choice in ("auto", "required") else [t for t in tools if t.name == choice]
    if not callable_:
        raise ConstraintError(f"no tool is named {choice!r}")
    # A named function is called exactly once (OpenAI's semantics, vLLM's behaviour): the grammar ends after its call,
    # so the model cannot repeat it until max_tokens.
    several = parallel and choice in ("auto", "required")
    calls = "call (\"\\n\" call)*" if several else "call"
    start = f"TEXT | {calls}" if choice == "auto" else calls
    body = {"anyOf": [_call_schema(t) for t in callable_]} if len(callable_) > 1 else _call_schema(callable_[0])
    return _checked(
        f"start: {start}\n"
        f"TEXT: {_TEXT}\n"
        f"call: {json.dumps(TOOL_CALL_OPEN + chr(10))} body {json.dumps(chr(10) + TOOL_CALL_CLOSE)}\n"
        f"body: %json {json.dumps(_compact(body))}\n"
    )


def _call_schema(tool: ToolFunction) -> dict[str, Any]:
    """{"name": <the name>, "arguments": <its parameters>}, in that order."""
    return {
        "type": "object",
        "properties": {"name": {"const": tool.name}, "arguments": tool.parameters},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _compact(schema: dict[str, Any]) -> dict[str, Any]:
    return {**schema, "x-guidance": _COMPACT}


def _checked(lark: str) -> Constraint:
    grammar = LLMatcher.grammar_from_lark(lark)
    _check_grammar(grammar)
    return Constraint(grammar)


def _check_grammar(grammar: str) -> None:
    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise ConstraintError(f"unsupported JSON schema: {messages[0]}")
