"""Turning a tool-calling answer's text into OpenAI's `tool_calls`, incrementally.

Constrained decoding writes calls in one exact form (engine.grammar.constraint):

    <tool_call>\\n{"name": "NAME", "arguments": ARGS}\\n</tool_call>

so a stream can be cut into OpenAI's deltas as it arrives: text outside the tags is `content`; a
call goes out when its closing tag has arrived, as OpenAI's two deltas: the first with its `index`,
`id`, `type` and `name` (and empty `arguments`), the next with its `arguments`. A call is held back
until then because only a complete call is a call: one cut off by max_tokens (or a deadline) never
reaches `tool_calls` with arguments that do not parse (:meth:`ToolCallParser.finish`). The text that
might be the start of a tag is held back until it is known not to be, so no tag text, whole or split
across chunks, ever reaches `content` or `arguments`.

A call's id is derived from the request id and the call's position (:func:`schemas.tools.call_id`), so
the worker that runs a server-side call names it as the client saw it; a call the worker answered
(its result is in the stream) is not one the client must answer (:func:`finish_reason`).
"""
from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from engine.grammar.constraint import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from schemas.events import GenerateRequest
from schemas.tools import ToolResult, call_id
from streams.wire.completion_models import ToolResultView

_HEAD = re.compile(r'\s*\{"name": ("(?:[^"\\]|\\.)*"), "arguments": ')
_CLOSE = "\n" + TOOL_CALL_CLOSE  # a call's compact JSON never holds a raw newline, so this ends it


def calls_tools(gen: GenerateRequest) -> bool:
    """Whether the answer may hold tool calls, to be returned as `tool_calls` rather than text."""
    return gen.constraint is not None and gen.constraint.kind == "tool_calls"


def _held_back(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


def _parsed_call(body: str) -> tuple[str, str] | None:
    """A call's name and its arguments' text (as the model wrote them), or None when the body is not a whole call."""
    head = _HEAD.match(body)
    try:
        whole = json.loads(body)  # the whole body, not just the arguments: a cut-off number (`1` of `12`) parses
    except ValueError:
        return None
    if head is None or not isinstance(whole, dict) or list(whole) != ["name", "arguments"]:
        return None
    return whole["name"], body.rstrip()[head.end():-1]


@dataclass
class ToolCallParser:
    """Feed it the answer's text as it comes; it returns OpenAI delta fields (content or tool_calls)."""

    request_id: str = ""  # names the calls (call_id(request_id, index))
    calls: list[dict[str, Any]] = field(default_factory=list)  # the whole calls so far, OpenAI's message form
    content: str = ""  # the whole content so far
    _buf: str = ""
    _in_call: bool = False  # after an opening tag: the buffer is the call's body so far
    # Nothing but whitespace yet, or since the last call: a tag's start here is a call's (a cut-off one is dropped).
    _call_next: bool = True

    def feed(self, text: str) -> list[dict[str, Any]]:
        self._buf += text
        out: list[dict[str, Any]] = []
        while (deltas := self._step()) is not None:
            out += deltas
        return out

    def finish(self) -> list[dict[str, Any]]:
        """What is left at the end of the answer: a call cut off (by max_tokens, a deadline) is not a call."""
        out = self.feed("")
        rest, self._buf = self._buf, ""
        if self._in_call:
            self._in_call = False
            body = rest[: len(rest) - _held_back(rest, _CLOSE)]
            if _parsed_call(body) is not None:  # only its closing tag was cut: the call itself is whole
                return out + self._call(body)
            # Cut inside the call. OpenAI returns output cut off by max_tokens as the message's `content`, with
            # finish_reason "length" (as it does a structured output cut short); arguments that do not parse are
            # not a call a client could run, so the partial call is content, without its tag.
            return out + self._content(body.lstrip("\n"))
        if rest and not self._call_next:  # text that merely ended like the start of a tag
            out += self._content(rest)
        # else: the cut-off start of a call's opening tag: tag text, never content
        return out

    def message_content(self) -> str | None:
        """The message's content as OpenAI gives it: null when the answer is only tool calls."""
        return (self.content or None) if self.calls else self.content

    def _step(self) -> list[dict[str, Any]] | None:
        """The deltas of what the buffer completes (possibly none), or None when it needs more text."""
        if self._in_call:
            at = self._buf.find(_CLOSE)
            if at < 0:
                return None
            body, self._buf, self._in_call = self._buf[:at], self._buf[at + len(_CLOSE):], False
            return self._call(body)
        at = self._buf.find(TOOL_CALL_OPEN)
        if at >= 0:
            text, self._buf, self._in_call = self._buf[:at], self._buf[at + len(TOOL_CALL_OPEN):], True
            return self._content(text)
        keep = _held_back(self._buf, TOOL_CALL_OPEN)
        text, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep:]
        return self._content(text) if text else None

    def _content(self, text: str) -> list[dict[str, Any]]:
        if not text or (self.calls and not text.strip()):  # the newline between two calls is not content
            return []
        self.content += text
        self._call_next = False
        return [{"content": text}]

    def _call(self, body: str) -> list[dict[str, Any]]:
        parsed = _parsed_call(body)
        if parsed is None:  # not the grammar's form (a model writing tags unconstrained): text, without the tags
            return self._content(body.strip())
        name, arguments = parsed
        index = len(self.calls)
        self.calls.append({"id": call_id(self.request_id, index), "type": "function",
                           "function": {"name": name, "arguments": arguments}})
        self._call_next = True
        first = {"index": index, "id": self.calls[-1]["id"], "type": "function",
                 "function": {"name": name, "arguments": ""}}
        return [{"tool_calls": [first]}, {"tool_calls": [{"index": index, "function": {"arguments": arguments}}]}]


def parse_message(text: str, request_id: str = "") -> tuple[str | None, list[dict[str, Any]]]:
    """A whole answer: its content (None when it is only calls) and its tool calls."""
    parser = ToolCallParser(request_id)
    parser.feed(text)
    parser.finish()
    return parser.message_content(), parser.calls


def finish_reason(reason: str, calls: list[dict[str, Any]], answered: Collection[str] = ()) -> str:
    """OpenAI's finish_reason: "tool_calls" when the answer ended after calls the client must answer (not those
    the server ran: their results are in the stream)."""
    return "tool_calls" if reason == "stop" and any(c["id"] not in answered for c in calls) else reason


def result_view(result: ToolResult) -> ToolResultView:
    """A server-side call's result as the client sees it (the `specstream.tool_result` of a stream's event)."""
    return ToolResultView(tool_call_id=result.call_id, name=result.tool, output=result.output, error=result.error,
                          truncated=result.truncated, duration_s=result.duration_s)
