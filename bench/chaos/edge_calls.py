"""HTTP calls of the chaos flows that ride through edge restarts: reads retried on the other edge, creations
resent only when a look-up shows they were not made."""
from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from bench.chaos.ledger import FlowContext, Tally

CHAT = "/v1/chat/completions"
RETRY_STATUS = frozenset({500, 502, 503, 504})
Json = dict[str, Any]
Finder = Callable[[], Awaitable[Json | None]]


async def sleep_until(at: float) -> None:
    await asyncio.sleep(max(0.0, at - time.monotonic()))


def pause(attempt: int) -> float:
    return min(8.0, 0.5 * 2 ** attempt) * random.uniform(0.7, 1.3)  # jittered: the flows do not retry in step


def as_json(response: httpx.Response) -> Json:
    try:
        data = response.json()
    except ValueError:
        return {"text": response.text[:200]}
    return data if isinstance(data, dict) else {"data": data}


def error_of(body: Json) -> Json:
    return body["error"] if isinstance(body.get("error"), dict) else {}  # OpenAI's shape: {"error": {"code", ...}}


def why(status: int, body: Json) -> str:
    error = error_of(body)
    return f"{status or 'no answer'} {error.get('code') or ''}: {str(error.get('message') or body)[:120]}"


def count(tally: Tally, outcome: str, note: str | None = None) -> None:
    setattr(tally, outcome, getattr(tally, outcome) + 1)
    if note:
        tally.note(note)


async def request(client: httpx.AsyncClient, ctx: FlowContext, method: str, path: str, *, deadline: float,
                  n: int = 0, **kw: Any) -> httpx.Response:
    """An idempotent call: a connection error or a 5xx is retried on the other edge with backoff until deadline,
    then the last response is returned (the last connection error raised)."""
    attempt = 0
    while True:
        try:
            response = await client.request(method, ctx.base_url(n + attempt) + path, headers=ctx.headers, **kw)
            if response.status_code not in RETRY_STATUS or time.monotonic() >= deadline:
                return response
        except httpx.TransportError:
            if time.monotonic() >= deadline:
                raise
        attempt += 1
        await asyncio.sleep(pause(attempt))


async def create(client: httpx.AsyncClient, ctx: FlowContext, path: str, *, deadline: float, find: Finder,
                 n: int = 0, **kw: Any) -> tuple[int, Json, bool]:
    """A POST that makes something uniquely named: resent at once when it surely never arrived (no connection), after
    an unanswered try (a 5xx, a dropped connection) only when ``find`` does not see it made. Returns (status, body,
    found after an unanswered try); status 0: nothing answered by deadline."""
    attempt, status, body = 0, 0, {}
    while True:
        unanswered = False
        try:
            response = await client.post(ctx.base_url(n + attempt) + path, headers=ctx.headers, **kw)
            status, body = response.status_code, as_json(response)
            if status not in RETRY_STATUS:
                return status, body, False
            unanswered = True
        except (httpx.ConnectError, httpx.ConnectTimeout):
            pass
        except httpx.TransportError:
            unanswered = True
        attempt += 1
        await asyncio.sleep(pause(attempt))
        if unanswered and (found := await find()) is not None:
            return 200, found, True
        if time.monotonic() >= deadline:
            return status, body, False


def finder(client: httpx.AsyncClient, ctx: FlowContext, path: str, key: str = "", value: str = "") -> Finder:
    """A read of ``path``: the object itself (no key), or the item of its list whose ``key`` is ``value``."""
    async def find() -> Json | None:
        try:
            response = await request(client, ctx, "GET", path, deadline=time.monotonic() + 30)
        except httpx.TransportError:
            return None
        body = as_json(response) if response.status_code == 200 else None
        return body if not key or body is None else next((i for i in body.get("data", []) if i.get(key) == value), None)
    return find


def kafka_settings(ctx: FlowContext) -> Any:
    """The deployment's Kafka settings (its SPECSTREAM_KAFKA__*): a reply topic of ours is replicated like its own."""
    from streams.config.kafka import KafkaSettings

    given = {k.removeprefix("SPECSTREAM_KAFKA__").lower(): v for k, v in ctx.env.items()
             if k.startswith("SPECSTREAM_KAFKA__")}
    return KafkaSettings.model_validate({**given, "bootstrap_servers": ctx.bootstrap, "topic_prefix": ctx.topic_prefix})


