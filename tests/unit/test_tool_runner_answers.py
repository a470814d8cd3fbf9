"""The tool runner answers each intent once: a redelivered copy of an intent whose result Kafka acknowledged is not
answered again (found by the chaos soak: a broker frozen under the runner's commit left three results for two
intents), while a new intent for a call it answered (a regenerated request asking again) gets the result again,
and a copy whose result was never acknowledged is answered."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from schemas.tools import ToolIntent, ToolResult
from streams.config import Settings
from streams.service.offsets import Source
from streams.tools.executors import ToolOutcome
from streams.tools.runner import ToolRunner

pytestmark = pytest.mark.asyncio


@dataclass
class FakeDelivery:
    """What the runner's handler uses of a delivery: where the intent came from, and its publishes."""

    source: Source
    acknowledged: bool = True
    published: list[asyncio.Future[Any]] = field(default_factory=list)
    results: list[ToolResult] = field(default_factory=list)

    def publish(self, topic: str, key: bytes, event: ToolResult) -> None:
        ack: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.acknowledged:
            ack.set_result(None)
        else:
            ack.set_exception(TimeoutError("not acknowledged by Kafka"))
        self.published.append(ack)
        self.results.append(event)


def _intent(call_id: str = "call_1") -> ToolIntent:
    return ToolIntent(request_id="r1", call_id=call_id, tool="calculator", arguments={"expression": "2+3"},
                      tenant="default", deadline=time.time() + 60, created_at=time.time())


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> tuple[ToolRunner, list[str]]:
    runner = ToolRunner(Settings())
    ran: list[str] = []

    async def outcome(intent: ToolIntent) -> ToolOutcome:
        ran.append(intent.call_id)
        return ToolOutcome(output=5)

    monkeypatch.setattr(runner, "outcome", outcome)
    return runner, ran


async def _answer(runner: ToolRunner, delivery: FakeDelivery, intent: ToolIntent) -> None:
    await runner._on_intent(intent, delivery)  # noqa: SLF001 - the handler the consumer foundation calls
    await asyncio.sleep(0)  # the acknowledgement's callbacks


async def test_a_redelivered_copy_of_an_acknowledged_intent_is_not_answered_again(runner: Any) -> None:
    tools, ran = runner
    first, copy = FakeDelivery(Source("intents", 1, 7)), FakeDelivery(Source("intents", 1, 7))
    await _answer(tools, first, _intent())
    await _answer(tools, copy, _intent())
    assert len(first.results) == 1 and copy.results == [] and ran == ["call_1"]


async def test_a_new_intent_for_an_answered_call_gets_the_result_again_without_running_it(runner: Any) -> None:
    tools, ran = runner
    first, again = FakeDelivery(Source("intents", 1, 7)), FakeDelivery(Source("intents", 2, 3))
    await _answer(tools, first, _intent())
    await _answer(tools, again, _intent())
    assert again.results == first.results and ran == ["call_1"]


async def test_a_copy_whose_result_was_never_acknowledged_is_answered(runner: Any) -> None:
    tools, ran = runner
    lost, copy = FakeDelivery(Source("intents", 0, 4), acknowledged=False), FakeDelivery(Source("intents", 0, 4))
    await _answer(tools, lost, _intent())
    await _answer(tools, copy, _intent())
    assert len(copy.results) == 1 and copy.results[0].output == 5
