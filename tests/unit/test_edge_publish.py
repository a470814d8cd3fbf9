"""The edge's publish of a request: bounded by edge.publish_timeout_s, and a publish given up on is cancelled."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from schemas.events import GenerateRequest, ReplyRoute, SamplingParams
from streams.config import Settings
from streams.edge.core import Edge
from streams.edge.settings import EdgeOptions
from streams.wire.errors import EdgeError


def _edge(tmp_path: Path, publish_timeout_s: float) -> tuple[Edge, list[tuple[str, str]]]:
    settings = Settings.model_validate({"edge": {"publish_timeout_s": publish_timeout_s},
                                        "files": {"dir": str(tmp_path)}})
    edge = Edge(EdgeOptions(settings))
    edge.connected.set()
    cancelled: list[tuple[str, str]] = []
    edge.publisher.cancel_soon = lambda request_id, reason="": cancelled.append((request_id, reason))  # type: ignore[method-assign]
    return edge, cancelled


def _request() -> GenerateRequest:
    return GenerateRequest(request_id="chatcmpl-1", prompt="hi", model="m", sampling=SamplingParams(max_tokens=4),
                           reply_to=ReplyRoute(topic="r"))


async def test_a_publish_never_acknowledged_answers_503_naming_the_timeout_and_cancels_the_request(
        tmp_path: Path) -> None:
    edge, cancelled = _edge(tmp_path, publish_timeout_s=0.2)

    async def unacknowledged(request: GenerateRequest) -> None:
        await asyncio.Event().wait()

    edge.publisher.publish_request = unacknowledged  # type: ignore[method-assign]
    with pytest.raises(EdgeError) as raised:
        await edge.submit(_request())
    assert raised.value.status == 503
    assert "no acknowledgement within edge.publish_timeout_s (0.2 s)" in raised.value.message
    # The record may still reach the broker later: no worker should spend time on it.
    assert cancelled == [("chatcmpl-1", "publishing failed at the edge")]
    assert "chatcmpl-1" not in edge.router._inflight  # its reply stream is closed
