"""The chaos run's chat traffic: websocket clients that cancel some requests, an SSE client, a raw Kafka client with
a reply topic of its own, and forced python-tool and file_search chats; each flow files what its client received
and turns it into a ledger row."""
from __future__ import annotations

import asyncio
import collections
import json
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.chaos.ledger import FlowContext, Tally, say
from streams.testing.reliability import PROMPTS, Answer, chat_body

MAX_TOKENS = 16
ANSWER_TIMEOUT_S = 300.0
# A client waits this long after an error before its next request, as real clients back off.
ERROR_BACKOFF_S = 1.0


@dataclass
class Drop:
    """A connection that closed under a request: (when, which edge) decides whether an edge fault explains it."""

    at: float
    edge: int


@dataclass
class EdgeFaults:
    """When each edge was killed, stopped, or lost its reply topic (time.time()), filled in by the fault runner."""

    at: dict[int, list[float]] = field(default_factory=lambda: collections.defaultdict(list))

    def explains(self, drop: Drop, before_s: float = 90.0) -> bool:
        return any(t - 2.0 <= drop.at <= t + before_s for t in self.at[drop.edge])


def _divergent(texts_by_prompt: dict[str, list[str]], tally: Tally) -> None:
    """Greedy answers to one prompt must be equal: every one apart from the most common is wrong."""
    for prompt, texts in texts_by_prompt.items():
        common, count = collections.Counter(texts).most_common(1)[0]
        if count != len(texts):
            tally.wrong += len(texts) - count
            tally.note(f"{prompt!r}: {len(texts) - count} answers differ from {common!r}")


class WsChatFlow:
    """Closed-loop websocket clients, one per edge in turn; every `cancel_every`-th request is cancelled after its
    first chunk."""

    def __init__(self, clients: int, faults: EdgeFaults, cancel_every: int = 6) -> None:
        self.clients, self.faults, self.cancel_every = clients, faults, cancel_every
        self.answers: list[tuple[Answer, int, bool]] = []  # (answer, edge, cancel sent)
        self.drops: dict[str, Drop] = {}

    async def run(self, ctx: FlowContext, stop_at: float) -> None:
        await asyncio.gather(*(self._client(ctx, n, stop_at) for n in range(self.clients)))

    async def _client(self, ctx: FlowContext, n: int, stop_at: float) -> None:
        from websockets.asyncio.client import connect

        rng, seq, edge = random.Random(n), 0, n
        while time.monotonic() < stop_at:
            edge += 1  # each connection on the other edge: a dead edge's clients fall over, as behind a balancer
            url = ctx.base_url(edge).replace("http://", "ws://") + "/v1/ws"
            answer: Answer | None = None
            try:
                async with connect(url, additional_headers=ctx.headers, open_timeout=10, max_size=None) as ws:
                    while time.monotonic() < stop_at:
                        seq += 1
                        cancel = seq % self.cancel_every == 0
                        answer = Answer(f"ws{n}-{seq}", time.time(), prompt=rng.choice(PROMPTS))
                        self.answers.append((answer, edge % len(ctx.base_urls), cancel))
                        await ws.send(json.dumps(chat_body(answer.tag, answer.prompt, model=ctx.model,
                                                           max_tokens=MAX_TOKENS)))
                        await self._read(ws, answer, cancel)
                        if answer.errors:
                            await asyncio.sleep(ERROR_BACKOFF_S)
                        answer = None
            except Exception as error:  # noqa: BLE001 - a dropped socket is filed, then the client reconnects
                if answer is not None and not answer.final:
                    self.drops[answer.tag] = Drop(time.time(), edge % len(ctx.base_urls))
                if time.monotonic() < stop_at:
                    say(f"ws client {n}: {type(error).__name__}: {error}; reconnecting to the other edge")
                    await asyncio.sleep(ERROR_BACKOFF_S)

    async def _read(self, ws: Any, answer: Answer, cancel: bool) -> None:
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        cancelled = False
        while not answer.final:
            frame = json.loads(await asyncio.wait_for(ws.recv(), timeout=deadline - time.monotonic()))
            if frame.get("id") != answer.tag:
                continue
            if frame["type"] == "error" and frame.get("code") == "unknown_id":
                continue  # the cancel crossed the done frame: the request had ended
            answer.record(frame, time.time())
            if cancel and not cancelled and frame["type"] == "chunk":
                cancelled = True
                await ws.send(json.dumps({"type": "cancel", "id": answer.tag}))

    def settle(self) -> Tally:
        tally = Tally("chat (websocket)")
        texts: dict[str, list[str]] = collections.defaultdict(list)
        for answer, _edge, cancel in self.answers:
            tally.accepted += 1
            codes = [e.get("code") for e in answer.errors]
            if not answer.final:
                drop = self.drops.get(answer.tag)
                if drop is not None and self.faults.explains(drop):
                    tally.dropped += 1
                else:
                    tally.lost += 1
                    tally.note(f"{answer.tag}: no final frame" + (" (socket closed, no edge fault)" if drop else ""))
            elif len(answer.dones) + len(answer.errors) > 1:
                tally.doubled += 1
                tally.note(f"{answer.tag}: {answer.problems()}")
            elif cancel and codes == ["cancelled"]:
                tally.cancelled += 1
            elif answer.errors:
                tally.errors += 1
                tally.note(f"{answer.tag}: error {answer.errors[0].get('code')}: {answer.errors[0].get('message')}")
            elif answer.problems():
                tally.doubled += 1
                tally.note(f"{answer.tag}: {answer.problems()}")
            else:
                tally.complete += 1
                if not cancel:
                    texts[answer.prompt].append(answer.text)
        _divergent(texts, tally)
        return tally


@dataclass
class SseAnswer:
    prompt: str
    edge: int
    chunks: list[str] = field(default_factory=list)
    finishes: int = 0
    done: bool = False
    error: str | None = None
    dropped_at: float | None = None


class SseChatFlow:
    """One closed-loop client streaming chat completions over HTTP (server-sent events), alternating edges."""

    def __init__(self, faults: EdgeFaults) -> None:
        self.faults = faults
        self.answers: list[SseAnswer] = []

    async def run(self, ctx: FlowContext, stop_at: float) -> None:
        rng, n = random.Random(99), 0
        async with httpx.AsyncClient(timeout=httpx.Timeout(ANSWER_TIMEOUT_S, connect=10)) as client:
            while time.monotonic() < stop_at:
                n += 1
                answer = SseAnswer(rng.choice(PROMPTS), n % len(ctx.base_urls))
                body = {**chat_body("", answer.prompt, model=ctx.model, max_tokens=MAX_TOKENS), "stream": True}
                body.pop("id")
                try:
                    await self._stream(client, ctx, answer, body)
                except httpx.ConnectError:
                    await asyncio.sleep(ERROR_BACKOFF_S)  # never reached an edge: not accepted, try the other one
                    continue
                except (httpx.HTTPError, OSError) as error:
                    answer.dropped_at = time.time()
                    say(f"sse client: {type(error).__name__}: {error}")
                self.answers.append(answer)
                if answer.error is not None or answer.dropped_at is not None:
                    await asyncio.sleep(ERROR_BACKOFF_S)

    async def _stream(self, client: httpx.AsyncClient, ctx: FlowContext, answer: SseAnswer,
                      body: dict[str, Any]) -> None:
        async with client.stream("POST", ctx.base_url(answer.edge) + "/v1/chat/completions", json=body,
                                 headers=ctx.headers) as response:
            if response.status_code != 200:
                answer.error = f"{response.status_code} {(await response.aread())[:200]!r}"
                return
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: "):]
                if data == "[DONE]":
                    answer.done = True
                    return
                event = json.loads(data)
                if "error" in event:
                    answer.error = f"{event['error'].get('code')}: {event['error'].get('message')}"
                    continue
                for choice in event.get("choices", []):
                    answer.chunks.append(choice.get("delta", {}).get("content") or "")
                    answer.finishes += choice.get("finish_reason") is not None

    def settle(self) -> Tally:
        tally = Tally("chat (HTTP SSE)")
        texts: dict[str, list[str]] = collections.defaultdict(list)
        for answer in self.answers:
            tally.accepted += 1
            if answer.error is not None:
                tally.errors += 1
                tally.note(f"error {answer.error}")
            elif answer.done and answer.finishes == 1:
                tally.complete += 1
                texts[answer.prompt].append("".join(answer.chunks))
            elif answer.done:
                tally.doubled += 1
                tally.note(f"{answer.finishes} finish reasons in one stream")
            elif answer.dropped_at is not None and self.faults.explains(Drop(answer.dropped_at, answer.edge)):
                tally.dropped += 1
            else:
                tally.lost += 1
                tally.note(f"stream ended without [DONE] ({len(answer.chunks)} chunks)")
        _divergent(texts, tally)
        return tally


@dataclass
class RawAnswer:
    prompt: str
    chunks: list[tuple[int, str]] = field(default_factory=list)  # (text_offset, text)
    completions: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class RawKafkaFlow:
    """Requests published straight onto the request topic with a reply topic of the client's own. The bus is at
    least once: a redelivered request may answer twice, each answer the same text at the same offsets."""

    def __init__(self, every_s: float = 2.0) -> None:
        self.every_s = every_s
        self.answers: dict[str, RawAnswer] = {}

    async def run(self, ctx: FlowContext, stop_at: float) -> None:
        from schemas.events import ChatMessage, GenerateRequest, ReplyRoute, SamplingParams
        from schemas.topics import TopicCatalog
        from streams.config import KafkaSettings
        from streams.kafka import clients

        kafka = KafkaSettings(bootstrap_servers=ctx.bootstrap, topic_prefix=ctx.topic_prefix, replication_factor=3,
                              min_insync_replicas=2)
        catalog = TopicCatalog(prefix=ctx.topic_prefix)
        reply = catalog.replies(f"raw-{uuid.uuid4().hex[:8]}")
        rng = random.Random(7)
        async with clients.reply_session(kafka, reply, client_id="chaos-raw") as (consumer, producer):
            reader = asyncio.create_task(self._read(consumer, stop_at + ANSWER_TIMEOUT_S))
            while time.monotonic() < stop_at:
                rid = f"raw-{uuid.uuid4().hex[:12]}"
                prompt = rng.choice(PROMPTS)
                request = GenerateRequest(
                    request_id=rid, messages=[ChatMessage(role="user", content=prompt)], model=ctx.model,
                    sampling=SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, seed=1),
                    reply_to=ReplyRoute(topic=reply.name, partition=0), created_at=time.time(),
                    deadline=time.time() + ANSWER_TIMEOUT_S, tenant="chaos")
                try:
                    await producer.send_and_wait(catalog.requests.name, clients.encode(request),
                                                 key=clients.request_key(rid))
                    self.answers[rid] = RawAnswer(prompt)
                except Exception as error:  # noqa: BLE001 - not accepted by the bus: the client saw the error
                    say(f"raw client: publish failed: {type(error).__name__}: {error}")
                await asyncio.sleep(self.every_s)
            await reader

    async def _read(self, consumer: Any, until: float) -> None:
        from schemas.events import Completion, ErrorEvent, TokenChunk
        from streams.kafka import clients

        while time.monotonic() < until:
            if self.answers and all(a.completions or a.errors for a in self.answers.values()) \
                    and time.monotonic() > until - ANSWER_TIMEOUT_S:
                return
            for records in (await consumer.getmany(timeout_ms=500)).values():
                for record in records:
                    event = clients.decode_reply(record.value)
                    answer = self.answers.get(getattr(event, "request_id", ""))
                    if answer is None:
                        continue
                    if isinstance(event, TokenChunk):
                        answer.chunks.append((event.text_offset or 0, event.text))
                    elif isinstance(event, Completion):
                        answer.completions.append(event.text)
                    elif isinstance(event, ErrorEvent):
                        answer.errors.append(event.code)

    def settle(self) -> Tally:
        tally = Tally("raw Kafka requests")
        texts: dict[str, list[str]] = collections.defaultdict(list)
        for rid, answer in self.answers.items():
            tally.accepted += 1
            if not answer.completions and not answer.errors:
                tally.lost += 1
                tally.note(f"{rid}: no Completion or ErrorEvent")
            elif answer.errors and not answer.completions:
                tally.errors += 1
                tally.note(f"{rid}: {answer.errors}")
            elif len(set(answer.completions)) > 1 or any(
                    c != answer.completions[0][o:o + len(c)] for o, c in answer.chunks):
                tally.wrong += 1
                tally.note(f"{rid}: redelivered answers disagree ({answer.completions})")
            else:
                tally.complete += 1
                texts[answer.prompt].append(answer.completions[0])
        _divergent(texts, tally)
        return tally
