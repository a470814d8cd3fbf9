"""The worker's tool rounds without a broker or an engine: a delivery that records what it would publish.

A round that ends with calls of registered tools publishes one intent per call, waits for the first result
of each (later copies are ignored), sends each result as a chunk without text, and continues with the
conversation grown by the calls and the results; the last round offers no tools. Unregistered tools, a
round cut by max_tokens, or max_rounds reached end the answer as before.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from engine.outputs import RequestOutput, RequestStats
from schemas.events import (
    GenerateRequest,
    OutputConstraint,
    ReplyRoute,
    TokenChunk,
    ToolSpec,
)
from schemas.tools import ToolIntent, ToolResult, call_id
from streams.config.tools import ToolsSettings
from streams.worker.replies import Generation
from streams.worker.tool_rounds import ToolRounds

pytestmark = pytest.mark.asyncio

CALL = '<tool_call>\n{"name": "%s", "arguments": %s}\n</tool_call>'


class RecordingDelivery:
    """The parts of a Delivery the tool rounds use."""

    def __init__(self) -> None:
        self.replies: list[Any] = []
        self.published: list[tuple[str, bytes, Any]] = []
        self.done = False
        self.received_at = 0.0

    def reply(self, event: Any) -> None:
        self.replies.append(event)

    def publish(self, topic: str, key: bytes, event: Any, *, partition: int | None = None) -> None:
        self.published.append((topic, key, event))


def request(tool: str = "python", max_tokens: int = 200) -> GenerateRequest:
    return GenerateRequest(
        request_id="req-1", messages=[{"role": "user", "content": "6*7?"}], model="m", tenant="acme",
        reply_to=ReplyRoute(topic="p.replies.e"), sampling={"max_tokens": max_tokens},
        tools=[ToolSpec(name=tool)], constraint=OutputConstraint(kind="tool_calls", tool_choice=tool))


class Harness:
    def __init__(self, max_rounds: int = 1, result_timeout_s: float = 5.0, tool: str = "python",
                 max_tokens: int = 200) -> None:
        self.continued: list[GenerateRequest] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.rounds = ToolRounds(ToolsSettings(max_rounds=max_rounds, result_timeout_s=result_timeout_s),
                                 "p.tool-intents", proceed=lambda g, r: self.continued.append(r),
                                 spawn=lambda coro: self.tasks.append(asyncio.ensure_future(coro)))
        self.delivery = RecordingDelivery()
        self.generation = Generation(request(tool, max_tokens), self.delivery, transit_s=0.0)  # type: ignore[arg-type]

    def finish_round(self, text: str, reason: str = "stop", prompt_tokens: int = 10, cached: int = 0) -> bool:
        return self.rounds.takes_over(self.generation, self.output(text, reason, prompt_tokens, cached))

    @staticmethod
    def output(text: str, reason: str = "stop", prompt_tokens: int = 10, cached: int = 0) -> RequestOutput:
        return RequestOutput(request_id="req-1", token_ids=[1, 2, 3], text=text, finished=True,
                             finish_reason=reason,  # type: ignore[arg-type]
                             stats=RequestStats(prompt_tokens=prompt_tokens, completion_tokens=3, queued_s=0,
                                                ttft_s=0, total_s=0, cached_prompt_tokens=cached))

    async def intents(self, count: int) -> list[ToolIntent]:
        for _ in range(200):
            if len(self.delivery.published) >= count:
                break
            await asyncio.sleep(0.01)
        return [event for _, _, event in self.delivery.published]


def result(call: str, stdout: str) -> ToolResult:
    return ToolResult(request_id="req-1", call_id=call, tool="python", output={"stdout": stdout}, duration_s=0.01)


async def test_a_registered_call_runs_on_the_bus_and_the_generation_continues_with_its_result() -> None:
    h = Harness()
    assert h.finish_round(CALL % ("python", '{"code": "print(42)"}'))
    assert isinstance(h.delivery.replies[0], TokenChunk) and h.delivery.replies[0].finish_reason is None
    [intent] = await h.intents(1)
    assert intent.call_id == call_id("req-1", 0) and intent.arguments == {"code": "print(42)"}
    assert intent.tenant == "acme" and intent.deadline is not None
    await h.rounds.on_result(result(intent.call_id, "42\n"))
    await h.rounds.on_result(result(intent.call_id, "a second copy\n"))  # ignored
    await asyncio.gather(*h.tasks)
    chunk = h.delivery.replies[1]
    assert chunk.text == "" and chunk.tool_result.output == {"stdout": "42\n"} and chunk.index == 1
    [following] = h.continued
    assistant, tool = following.messages[-2:]
    assert assistant.tool_calls[0].id == intent.call_id and tool.role == "tool"
    assert tool.tool_call_id == intent.call_id and json.loads(tool.content)["output"] == {"stdout": "42\n"}
    # max_rounds 1: the next round offers no tools, so the model answers in words.
    assert following.tools is None and following.constraint is None and following.sampling.max_tokens == 197


async def test_before_the_last_round_the_model_may_call_again() -> None:
    h = Harness(max_rounds=2)
    assert h.finish_round(CALL % ("python", '{"code": "1"}'))
    [intent] = await h.intents(1)
    await h.rounds.on_result(result(intent.call_id, ""))
    await asyncio.gather(*h.tasks)
    constraint = h.continued[0].constraint
    assert constraint is not None and constraint.tool_choice == "auto" and h.continued[0].tools


async def test_no_result_in_time_continues_with_a_no_result_error() -> None:
    h = Harness(result_timeout_s=0.05)
    assert h.finish_round(CALL % ("python", '{"code": "1"}'))
    await asyncio.gather(*h.tasks)
    error = h.delivery.replies[1].tool_result.error
    assert error is not None and error.code == "no_result" and "0.05 s" in error.message


@pytest.mark.parametrize(("tool", "reason", "max_tokens"), [("get_weather", "stop", 200), ("python", "length", 200),
                                                            ("python", "stop", 3)])
async def test_other_rounds_end_the_answer_as_before(tool: str, reason: str, max_tokens: int) -> None:
    h = Harness(tool=tool, max_tokens=max_tokens)
    assert not h.finish_round(CALL % (tool, '{"code": "1"}'), reason)
    assert h.delivery.replies == [] and h.tasks == []


async def test_calls_stop_after_max_rounds() -> None:
    h = Harness(max_rounds=0)
    assert not h.finish_round(CALL % ("python", '{"code": "1"}'))


async def test_the_answers_usage_adds_up_every_rounds_prompt_and_cached_tokens() -> None:
    h = Harness()
    assert h.finish_round(CALL % ("python", '{"code": "print(42)"}'), prompt_tokens=10, cached=0)
    [intent] = await h.intents(1)
    await h.rounds.on_result(result(intent.call_id, "42\n"))
    await asyncio.gather(*h.tasks)
    # The next round resent the conversation: the engine found its first 16 tokens cached.
    last = h.output("The answer is 42.", prompt_tokens=40, cached=16)
    usage = h.rounds.finish(h.generation, h.generation.completion(last, "stop", "m")).usage
    assert usage.prompt_tokens == 50 and usage.prompt_tokens_details.cached_tokens == 16
