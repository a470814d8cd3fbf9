"""A response's output items and OpenAI's stream events, built as the answer's text arrives.

One builder serves both ways of answering, so a streamed response ends with exactly the object a non-streamed one
returns: fed the text of each chunk, it yields OpenAI's events in order, each with its ``sequence_number``
(``response.created``, ``response.in_progress``, then per item ``response.output_item.added``, for a message
``response.content_part.added``, ``response.output_text.delta``..., ``response.output_text.done``,
``response.content_part.done``, for a function call ``response.function_call_arguments.delta`` / ``.done``, then
``response.output_item.done``), and at the end ``response.completed`` or, cut off by ``max_output_tokens``,
``response.incomplete`` with ``incomplete_details.reason``. A non-streamed request feeds the whole text at once and
returns the final object.

Tool calls are cut out of the text by the chat path's parser (:class:`~streams.wire.tool_calls.ToolCallParser`): a
call is an item only once it is whole, so a call cut off by the limit is never a ``function_call`` item (its text is
the message's, as on the chat path), and no tag text reaches an item.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from schemas.events import Completion, GenerateRequest
from schemas.retrieval import Retrieved
from streams.edge.responses.body import ResponsesBody
from streams.rag.grounding import citations
from streams.wire.response_models import ResponseObject
from streams.wire.tool_calls import ToolCallParser, calls_tools


def response_id_of(request_id: str) -> str:
    """The response's id, from its request's (``chatcmpl-<hex>``): one id names both in logs and on the bus."""
    return "resp_" + request_id.split("-", 1)[-1]


def _item_id(kind: str) -> str:
    return f"{kind}_{uuid.uuid4().hex}"


def usage_of(final: Completion) -> dict[str, Any]:
    """OpenAI's Responses usage: cached tokens are the engine's prefix-cache hits; the cache is automatic, so no
    write is billed (cache_write_tokens 0), and the model has no reasoning tokens."""
    u = final.usage
    cached = u.prompt_tokens_details.cached_tokens if u.prompt_tokens_details else 0
    return {"input_tokens": u.prompt_tokens, "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": u.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u.total_tokens}


def _tool_view(tool: Any) -> dict[str, Any]:
    """A request's tool as the response object lists it (OpenAI fills the optional fields with null)."""
    data = tool.model_dump(mode="json", by_alias=True)
    if data["type"] == "function":
        return {"type": "function", "name": data["name"], "description": data.get("description"),
                "parameters": data.get("parameters"), "strict": data.get("strict")}
    return {k: v for k, v in data.items() if v is not None}


def _choice_view(choice: Any) -> Any:
    if choice is None:
        return "auto"
    return choice if isinstance(choice, str) else choice.model_dump(mode="json")


def _text_view(body: ResponsesBody) -> dict[str, Any]:
    fmt = body.text.format if body.text is not None else None
    return {"format": {"type": "text"} if fmt is None else fmt.model_dump(mode="json", by_alias=True,
                                                                           exclude_none=True),
            "verbosity": "medium"}


def response_object(body: ResponsesBody, gen: GenerateRequest, *, status: str, output: list[dict[str, Any]],
                    usage: dict[str, Any] | None = None, incomplete_reason: str | None = None,
                    error: dict[str, Any] | None = None) -> ResponseObject:
    """OpenAI's response object, with what the request asked (``temperature``/``top_p``: the values applied)."""
    return ResponseObject.model_validate({
        "id": response_id_of(gen.request_id), "object": "response", "created_at": int(gen.created_at or time.time()),
        "status": status, "background": False, "error": error,
        "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
        "instructions": body.instructions, "max_output_tokens": body.max_output_tokens, "max_tool_calls": None,
        "model": gen.model, "output": output, "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id, "reasoning": {"effort": None, "summary": None},
        "service_tier": "default", "store": body.stores, "temperature": gen.sampling.temperature,
        "text": _text_view(body), "tool_choice": _choice_view(body.tool_choice),
        "tools": [_tool_view(t) for t in body.tools or []], "top_p": gen.sampling.top_p, "truncation": "disabled",
        "usage": usage, "user": body.user, "metadata": body.metadata or {},
    })


@dataclass
class ResponseBuilder:
    body: ResponsesBody
    gen: GenerateRequest
    output: list[dict[str, Any]] = field(default_factory=list)
    sequence: int = 0
    _parser: ToolCallParser | None = None
    final: ResponseObject | None = None  # the response object, once finished
    _message: dict[str, Any] | None = None  # the message item being written, if any

    def __post_init__(self) -> None:
        self._parser = ToolCallParser(self.gen.request_id) if calls_tools(self.gen) else None

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, **fields, "sequence_number": self.sequence}
        self.sequence += 1
        return event

    def start(self) -> list[dict[str, Any]]:
        snapshot = response_object(self.body, self.gen, status="in_progress", output=[]).model_dump()
        return [self._event("response.created", response=snapshot),
                self._event("response.in_progress", response=snapshot)]

    def feed(self, text: str) -> list[dict[str, Any]]:
        deltas = [{"content": text}] if self._parser is None else self._parser.feed(text)
        return [e for d in deltas for e in self._delta(d)]

    def finish(self, final: Completion, retrieved: Retrieved | None = None) -> list[dict[str, Any]]:
        events = [] if self._parser is None else [e for d in self._parser.finish() for e in self._delta(d)]
        cut = final.finish_reason == "length"
        events += self._close_message(final, retrieved, incomplete=cut)
        response = response_object(self.body, self.gen, status="incomplete" if cut else "completed",
                                   output=self.output, usage=usage_of(final),
                                   incomplete_reason="max_output_tokens" if cut else None)
        self.final = response
        return events + [self._event("response.incomplete" if cut else "response.completed",
                                     response=response.model_dump())]

    def error(self, error: Any) -> dict[str, Any]:
        """OpenAI's ``error`` event, for a request that failed after its stream began (an EdgeError)."""
        return self._event("error", code=error.code, message=error.message, param=error.param)

    # --- items -----------------------------------------------------------------------------------------------

    def _delta(self, delta: dict[str, Any]) -> list[dict[str, Any]]:
        if "content" in delta:
            return self._text(delta["content"])
        call = delta["tool_calls"][0]
        if "id" in call:  # a whole call's head; its arguments follow in the next delta
            events = self._close_message(None, None, incomplete=False)
            item = {"id": _item_id("fc"), "type": "function_call", "status": "in_progress", "call_id": call["id"],
                    "name": call["function"]["name"], "arguments": ""}
            self.output.append(item)
            return events + [self._event("response.output_item.added", output_index=len(self.output) - 1,
                                         item=dict(item))]
        item, index, arguments = self.output[-1], len(self.output) - 1, call["function"]["arguments"]
        item.update(arguments=arguments, status="completed")
        return [self._event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                            delta=arguments),
                self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                            arguments=arguments),
                self._event("response.output_item.done", output_index=index, item=dict(item))]

    def _text(self, text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self._message is None:
            self._message = {"id": _item_id("msg"), "type": "message", "status": "in_progress", "role": "assistant",
                             "content": []}
            self.output.append(self._message)
            index = len(self.output) - 1
            events += [self._event("response.output_item.added", output_index=index, item={**self._message}),
                       self._event("response.content_part.added", item_id=self._message["id"], output_index=index,
                                   content_index=0, part={"type": "output_text", "text": "", "annotations": []})]
            self._message["content"] = [{"type": "output_text", "text": "", "annotations": [], "logprobs": []}]
        self._message["content"][0]["text"] += text
        return events + [self._event("response.output_text.delta", item_id=self._message["id"],
                                     output_index=self.output.index(self._message), content_index=0, delta=text,
                                     logprobs=[])]

    def _close_message(self, final: Completion | None, retrieved: Retrieved | None, *,
                       incomplete: bool) -> list[dict[str, Any]]:
        message, self._message = self._message, None
        if message is None:
            return []
        index, part = self.output.index(message), message["content"][0]
        if retrieved is not None and final is not None:
            part["annotations"] = citations(part["text"], retrieved.passages)
        message["status"] = "incomplete" if incomplete else "completed"
        return [self._event("response.output_text.done", item_id=message["id"], output_index=index,
                            content_index=0, text=part["text"], logprobs=[]),
                self._event("response.content_part.done", item_id=message["id"], output_index=index,
                            content_index=0, part=dict(part)),
                self._event("response.output_item.done", output_index=index, item=dict(message))]


def answer(body: ResponsesBody, gen: GenerateRequest, final: Completion,
           retrieved: Retrieved | None = None) -> ResponseObject:
    """The response object of a finished request, answered at once (not streamed)."""
    builder = ResponseBuilder(body, gen)
    builder.start()
    builder.feed(final.text)
    builder.finish(final, retrieved)
    assert builder.final is not None
    return builder.final


def answered(body: ResponsesBody, gen: GenerateRequest, final: Completion,
             retrieved: Retrieved | None = None) -> dict[str, Any]:
    """The JSON of :func:`answer`."""
    return answer(body, gen, final, retrieved).model_dump()


def failed(body: ResponsesBody, gen: GenerateRequest, code: str, message: str) -> ResponseObject:
    """The response object of a request that failed after its stream began (``response.failed``)."""
    return response_object(body, gen, status="failed", output=[], error={"code": code, "message": message})
