"""Turning a tool-calling answer's text into OpenAI's `tool_calls`, incrementally.

Constrained decoding writes calls in one exact form (engine.grammar.constraint):

    <tool_call>\\n{"name": "NAME", "arguments": ARGS}\\n</tool_call>

so a stream can be cut into OpenAI's deltas as it arrives: text outside the tags is `content`; a
call's first delta carries its `index`, `id`, `type` and `name` (with empty `arguments`), the next
ones fragments of `arguments`, as OpenAI streams them. The text that might be the start of a tag is
held back until it is known not to be.

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

_HEAD = re.compile(r'\s*\{"name": ("(?:[^"\\]|\\.)*"), "arguments": ')
_END = "}\n" + TOOL_CALL_CLOSE  # the arguments' JSON never holds a raw newline, so this ends them


def calls_tools(gen: GenerateRequest) -> bool:
    """Whether the answer may hold tool calls, to be returned as `tool_calls` rather than text."""
    return gen.constraint is not None and gen.constraint.kind == "tool_calls"


def _held_back(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


@dataclass
class ToolCallParser:
    """Feed it the answer's text as it comes; it returns OpenAI delta fields (content or tool_calls)."""

    request_id: str = ""  # names the calls (call_id(request_id, index))
    calls: list[dict[str, Any]] = field(default_factory=list)  # the whole calls so far, OpenAI's message form
    content: str = ""  # the whole content so far
    _buf: str = ""
    _state: str = "text"  # text | head (inside a tag, before the arguments) | args

    def feed(self, text: str) -> list[dict[str, Any]]:
        self._buf += text
        out: list[dict[str, Any]] = []
        while True:
            delta = self._step()
            if delta is None:
                return out
            if delta:
                out.append(delta)

    def finish(self) -> list[dict[str, Any]]:
        """What is left at the end (a call cut by max_tokens keeps its partial arguments)."""
        out = self.feed("")
        rest, self._buf = self._buf, ""
        if rest and self._state == "args":
            out.append(self._arguments(rest))
        elif rest:
            out.append(self._content(rest if self._state == "text" else TOOL_CALL_OPEN + rest))
        return out

    def message_content(self) -> str | None:
        """The message's content as OpenAI gives it: null when the answer is only tool calls."""
        return (self.content or None) if self.calls else self.content

    def _step(self) -> dict[str, Any] | None:
        """One delta (possibly empty) from the buffer, or None when it needs more text."""
        if self._state == "text":
            at = self._buf.find(TOOL_CALL_OPEN)
            if at >= 0:
                text, self._buf, self._state = self._buf[:at], self._buf[at + len(TOOL_CALL_OPEN):], "head"
                return self._content(text)
            keep = _held_back(self._buf, TOOL_CALL_OPEN)
            text, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep:]
            return self._content(text) if text else None
        if self._state == "head":
            m = _HEAD.match(self._buf)
            if m is None:
                return None
            self._buf, self._state = self._buf[m.end():], "args"
            call = {"id": call_id(self.request_id, len(self.calls)), "type": "function",
                    "function": {"name": json.loads(m.group(1)), "arguments": ""}}
            self.calls.append(call)
            return {"tool_calls": [{"index": len(self.calls) - 1, **call,
                                    "function": {"name": call["function"]["name"], "arguments": ""}}]}
        at = self._buf.find(_END)
        if at >= 0:
            args, self._buf, self._state = self._buf[:at], self._buf[at + len(_END):], "text"
            return self._arguments(args) if args else {}
        keep = _held_back(self._buf, _END)
        args, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep:]
        return self._arguments(args) if args else None

    def _content(self, text: str) -> dict[str, Any]:
        if not text or (self.calls and not text.strip()):  # the newline between two calls is not content
            return {}
        self.content += text
        return {"content": text}

    def _arguments(self, fragment: str) -> dict[str, Any]:
        self.calls[-1]["function"]["arguments"] += fragment
        return {"tool_calls": [{"index": len(self.calls) - 1, "function": {"arguments": fragment}}]}


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


def result_view(result: ToolResult) -> dict[str, Any]:
    """A server-side call's result as the client sees it (the `specstream.tool_result` of a stream's event)."""
    return {"tool_call_id": result.call_id, "name": result.tool, "output": result.output,
            "error": result.error.model_dump() if result.error is not None else None,
            "truncated": result.truncated, "duration_s": result.duration_s}
