"""Server-side tool rounds: a generation whose answer calls registered tools continues with their results.

When a round of a tool-calling generation ends (``stop``) with calls, and every call names a tool of
``tools.registry``, the worker does not answer yet:

1. the round's last chunk goes out without a finish reason (the client keeps reading);
2. each call becomes a :class:`ToolIntent` on the tool-intents topic, keyed and named by its call id
   (:func:`schemas.tools.call_id`: the edge derives the same id for the call it streams);
3. the first :class:`ToolResult` of each call id (read by a listener on the tool-results topic; later copies are
   ignored) goes to the client as a chunk without text that carries it, or ``no_result`` after
   ``tools.result_timeout_s``;
4. the conversation gains the assistant's calls and one ``tool`` message per result, and the engine generates
   the next round under the same request id, so its chunks continue the same stream.

After ``tools.max_rounds`` rounds the model answers without tools. A round whose calls name an unregistered
tool (or any mix) ends the answer as before: its calls go to the client as ordinary ``tool_calls``.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from engine.outputs import RequestOutput
from schemas.answer import PromptTokensDetails
from schemas.events import (
    ChatMessage,
    Completion,
    GenerateRequest,
    OutputConstraint,
    TokenChunk,
    ToolCall,
    Usage,
)
from schemas.tools import ToolError, ToolIntent, ToolResult, call_id
from streams.config.tools import ToolsSettings
from streams.wire.tool_calls import calls_tools, parse_message
from streams.worker.replies import Generation

log = logging.getLogger("specstream.worker")

Continue = Callable[[Generation, GenerateRequest], None]
Spawn = Callable[[Coroutine[Any, Any, None]], None]


@dataclass
class _Conversation:
    """What a generation's rounds so far added up to."""

    request: GenerateRequest  # the next round's request (the first: the original)
    rounds: int = 0  # tool rounds run
    calls: int = 0  # calls made in all rounds (the next call's index)
    round_start: int = 0  # where the current round's text starts in the whole answer
    prompt_tokens: int = 0  # of the rounds before the current one
    cached_tokens: int = 0  # of those, found in the engine's prefix cache
    results: list[ToolResult] = field(default_factory=list)


class ToolRounds:
    def __init__(self, tools: ToolsSettings, intents_topic: str, *, proceed: Continue, spawn: Spawn) -> None:
        self.tools = tools
        self.intents_topic = intents_topic
        self._proceed = proceed
        self._spawn = spawn
        self._conversations: dict[str, _Conversation] = {}
        self._waiting: dict[str, asyncio.Future[ToolResult]] = {}

    def takes_over(self, generation: Generation, output: RequestOutput) -> bool:
        """At a generation's last output: True when its calls run here (the output's chunk is sent, unfinished)."""
        request = generation.request
        if not (calls_tools(request) and output.finish_reason == "stop" and self.tools.registry):
            return False
        convo = self._conversations.get(request.request_id) or _Conversation(request)
        text = "".join(generation.text)[convo.round_start:] + output.text
        _, calls = parse_message(text)
        budget = request.sampling.max_tokens - generation.tokens - len(output.token_ids)
        if not calls or convo.rounds >= self.tools.max_rounds or budget <= 0 \
                or any(c["function"]["name"] not in self.tools.registry for c in calls):
            return False
        self._conversations[request.request_id] = convo
        generation.delivery.reply(generation.chunk(output, None))
        if output.stats is not None:
            convo.prompt_tokens += output.stats.prompt_tokens
            convo.cached_tokens += output.stats.cached_prompt_tokens
        self._spawn(self._round(generation, convo, text, calls))
        return True

    def finish(self, generation: Generation, completion: Completion) -> Completion:
        """The answer's Completion with every round's results, and the usage of all rounds together."""
        convo = self._conversations.pop(generation.request_id, None)
        if convo is None or not convo.results:
            return completion
        prompt = convo.prompt_tokens + completion.usage.prompt_tokens
        last = completion.usage.prompt_tokens_details
        cached = PromptTokensDetails(cached_tokens=convo.cached_tokens + (last.cached_tokens if last else 0))
        usage = Usage(prompt_tokens=prompt, completion_tokens=generation.tokens, total_tokens=prompt + generation.tokens,
                      prompt_tokens_details=cached)
        return completion.model_copy(update={"tool_results": list(convo.results), "usage": usage})

    def forget(self, request_id: str) -> None:
        self._conversations.pop(request_id, None)

    async def on_result(self, result: ToolResult) -> None:
        """The tool-results listener: the first result of a call this worker waits for; the rest are ignored."""
        waiting = self._waiting.get(result.call_id)
        if waiting is not None and not waiting.done():
            waiting.set_result(result)

    async def _round(self, generation: Generation, convo: _Conversation, text: str, calls: list[dict[str, Any]]) -> None:
        request = convo.request
        made = [ToolCall(id=call_id(request.request_id, convo.calls + i), name=c["function"]["name"],
                         arguments=c["function"]["arguments"]) for i, c in enumerate(calls)]
        convo.calls += len(made)
        convo.rounds += 1
        results = await asyncio.gather(*(self._call(generation, call) for call in made))
        if generation.delivery.done:  # handed back or failed meanwhile: nothing more to say
            self.forget(request.request_id)
            return
        for result in results:
            generation.delivery.reply(TokenChunk(
                request_id=request.request_id, index=generation.next_index, text="", token_ids=[],
                text_offset=generation.text_chars, token_offset=generation.tokens, tool_result=result))
            generation.next_index += 1
        convo.results += results
        content, _ = parse_message(text)
        convo.request = self._next_request(convo, generation, content or "", made, results)
        convo.round_start = generation.text_chars
        self._proceed(generation, convo.request)

    async def _call(self, generation: Generation, call: ToolCall) -> ToolResult:
        request = generation.request
        timeout_s = self.tools.result_timeout_s
        deadline = time.time() + timeout_s
        if request.deadline is not None:
            deadline = min(deadline, request.deadline)
        started = time.monotonic()
        waiting = self._waiting[call.id] = asyncio.get_running_loop().create_future()
        try:
            arguments = _arguments(call.arguments)
            intent = ToolIntent(request_id=request.request_id, call_id=call.id, tool=call.name, arguments=arguments,
                                tenant=request.tenant, deadline=deadline, created_at=time.time())
            generation.delivery.publish(self.intents_topic, call.id.encode(), intent)
            return await asyncio.wait_for(waiting, timeout=max(0.001, deadline - time.time()))
        except (TimeoutError, ValueError) as error:
            why = str(error) if isinstance(error, ValueError) else f"no result within {timeout_s:g} s"
            log.warning("call %s (%s) of %s: %s", call.id, call.name, request.request_id, why)
            code = "rejected" if isinstance(error, ValueError) else "no_result"
            return ToolResult(request_id=request.request_id, call_id=call.id, tool=call.name,
                              error=ToolError(code=code, message=why), duration_s=time.monotonic() - started)
        finally:
            self._waiting.pop(call.id, None)

    def _next_request(self, convo: _Conversation, generation: Generation, content: str, calls: list[ToolCall],
                      results: list[ToolResult]) -> GenerateRequest:
        request = convo.request
        messages = [*(request.messages or []), ChatMessage(role="assistant", content=content, tool_calls=calls),
                    *(ChatMessage(role="tool", content=r.content(), tool_call_id=r.call_id) for r in results)]
        last = convo.rounds >= self.tools.max_rounds
        constraint = None if last else OutputConstraint(
            kind="tool_calls", tool_choice="auto", parallel_tool_calls=_parallel(request))
        sampling = request.sampling.model_copy(
            update={"max_tokens": generation.request.sampling.max_tokens - generation.tokens})
        # The last round offers no tools: the model answers from the results.
        return request.model_copy(update={"messages": messages, "constraint": constraint, "sampling": sampling,
                                          "tools": None if last else request.tools})


def _parallel(request: GenerateRequest) -> bool:
    return request.constraint.parallel_tool_calls if request.constraint is not None else True


def _arguments(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"the call's arguments are not JSON: {error.msg}") from None
    if not isinstance(value, dict):
        # Answered as a rejected call, like arguments that are not JSON.
        raise ValueError(f"the call's arguments are a JSON {type(value).__name__}, not an object")  # noqa: TRY004
    return value
