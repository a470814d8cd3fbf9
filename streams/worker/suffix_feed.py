"""Suffix decoding fed by the bus: what every worker generates, from ``<prefix>.completions``, drafts here.

Each worker records its finished requests on the completions topic (streams.worker.completions_log). A worker
whose engine drafts by suffix decoding (engine.speculation.method suffix, or eagle_suffix) also reads that topic,
from its start when it starts (warm: what the deployment generated before it existed drafts from its first
request) and then as it grows, and hands each answer, tokenized, to the engine's index of past outputs:

- in its tenant's scope, or the shared one where the operator shares outputs (engine.speculation.suffix_shared),
  the same scope the tenant's requests draft from (streams.worker.intake.draft_scope);
- never a record without its prompt: the tenant has log_prompts false, and its text is kept nowhere;
- never its own records of this run: the engine kept those when they finished (those of an earlier run under the
  same worker id are read like any other's);
- only answers of a model this worker serves (another model's text would rarely match); a LoRA adapter's from
  when the worker holds it.

Memory is bounded twice: the engine's index by its settings (suffix_max_outputs, suffix_max_output_tokens), and
the answers waiting here for the engine thread by the same count of outputs (the oldest dropped: the index would
evict them first anyway). Records are tokenized off the event loop and handed over in batches between engine steps.

The feed reads the topic itself, from before the engine loads: a consumer of its own (no group, every partition
from its beginning) starts with the worker's topics, so the backlog (the records before the end offsets taken at
that moment) is read while the model loads. It is read whole before anything is handed over: the index keeps only
the newest outputs, so learning the older ones would be undone by eviction. Of each record it parses only what it
uses (CompletionDigest: 8 µs a record, where validating a whole CompletionRecord takes about 100).
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from aiokafka import AIOKafkaConsumer, TopicPartition
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from schemas.base import SCHEMA_VERSION
from streams.config import Settings
from streams.kafka.clients import make_consumer
from streams.kafka.connection import Connectable
from streams.service.intake import Rejection, parse_message
from streams.worker.intake import draft_scope

log = logging.getLogger("specstream.worker.suffix_feed")

_BATCH = 512  # answers per hand-over: one engine-thread call each
_FETCH_RECORDS = 1000  # records read at once
_FETCH_BYTES = 16 * 1024 * 1024  # a partition's bytes per fetch (the backlog is read in big strides)
_RETRY_S = 1.0  # the reader's pause after a failed fetch
_ASSIGNED_S = 30.0  # the topic's partitions known (the worker created the topic just before)

EngineCall = Callable[[Callable[[Any], Any]], Awaitable[Any]]


class _Present(BaseModel):
    """A field read only for whether it is there (its content is skipped, unvalidated)."""

    model_config = ConfigDict(extra="ignore")


class _Answer(BaseModel):
    model_config = ConfigDict(extra="ignore")

    text: str = Field(description="The answer's text (Completion.text).")


class CompletionDigest(BaseModel):
    """What the suffix feed reads of a CompletionRecord (schemas.events): the fields it decides and learns from,
    the rest of the record skipped. tests/unit/test_worker_suffix_feed.py keeps it in step with the record."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    schema_version: Literal[1] = Field(default=SCHEMA_VERSION, description="As every event's (schemas.base).")
    tenant: str = Field(description="Tenant the request was billed to.")
    model: str = Field(description="Model the request asked for.")
    worker_id: str = Field(description="Worker that answered it.")
    recorded_at: float = Field(description="Unix time the record was published.")
    request: _Present | None = Field(description="Present unless the prompt was not to be logged.")
    completion: _Answer | None = Field(default=None, description="The final Completion; None for an error.")

    @field_validator("schema_version", mode="before")
    @classmethod
    def _not_a_bool(cls, version: Any) -> Any:
        if isinstance(version, bool):  # JSON true would pass as 1: refused, as parse_message refuses it
            raise ValueError(f"schema_version {version!r} is not supported")
        return version


def read_digest(value: bytes | None, max_bytes: int) -> CompletionDigest | Rejection:
    """A record's digest, or why it cannot be read (parse_message's precise reasons, on the slow path only)."""
    if value is not None and len(value) <= max_bytes:
        with contextlib.suppress(ValidationError):
            return CompletionDigest.model_validate_json(value)
    return parse_message(value, CompletionDigest, max_bytes=max_bytes)


class SuffixFeed:
    def __init__(self, worker_id: str, *, shared: bool, served: Callable[[], list[str]],
                 started_at: float | None = None, max_outputs: int = 10_000, max_bytes: int = 1024 * 1024) -> None:
        self.worker_id = worker_id
        self.started_at = time.time() if started_at is None else started_at
        self.shared = shared
        self._served = served
        self._max_bytes = max_bytes
        # (scope, text), at most what the index keeps (engine.speculation.suffix_max_outputs)
        self._pending: deque[tuple[str, str]] = deque(maxlen=max_outputs)
        self._backlog_read = asyncio.Event()  # set once every record from before the start has been read
        self._call: EngineCall | None = None
        self._tokenizer: Any = None
        self._flushing: asyncio.Task[None] | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._reading: asyncio.Task[None] | None = None
        self.read = 0  # records seen on the topic
        self.learned = 0  # answers the engine took

    @classmethod
    def from_settings(cls, settings: Settings, worker_id: str, *, served: Callable[[], list[str]]) -> SuffixFeed | None:
        """The feed of a worker drafting by suffix decoding from the completions topic; None for any other."""
        if not follows_completions(settings):
            return None
        spec = settings.engine.speculation
        return cls(worker_id, shared=spec.suffix_shared, served=served, max_outputs=spec.suffix_max_outputs,
                   max_bytes=int(settings.worker.max_message_bytes))

    async def start(self, kafka: Connectable, topic: str) -> None:
        """Read ``topic`` (every partition, from its beginning) from now on; its end offsets now bound the backlog."""
        consumer = make_consumer(kafka, enable_auto_commit=False, auto_offset_reset="earliest",
                                 client_id=f"specstream-suffix-feed-{self.worker_id}",
                                 max_partition_fetch_bytes=_FETCH_BYTES, fetch_max_bytes=2 * _FETCH_BYTES)
        await consumer.start()
        try:
            consumer.subscribe([topic])  # without a group: every partition is assigned, once its metadata is in
            async with asyncio.timeout(_ASSIGNED_S):
                while not consumer.assignment():
                    await asyncio.sleep(0.02)
            backlog = {tp: end for tp, end in (await consumer.end_offsets(list(consumer.assignment()))).items()
                       if end > 0}
        except BaseException:
            await consumer.stop()
            raise
        self._consumer = consumer
        self._reading = asyncio.create_task(self._read(consumer, backlog), name="suffix-feed-reader")

    async def stop(self) -> None:
        if self._reading is not None:
            self._reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reading
        if self._consumer is not None:
            await self._consumer.stop()
        self._reading = self._consumer = None

    def attach(self, call: EngineCall, tokenizer: Any) -> None:
        """The engine is loaded: answers read before now are handed over from here on."""
        self._call, self._tokenizer = call, tokenizer
        self._kick()

    def backlog_read(self) -> None:
        """Every record from before the start has been read: what is pending can be handed over."""
        self._backlog_read.set()
        self._kick()

    def wanted(self, record: CompletionDigest) -> bool:
        mine = record.worker_id == self.worker_id and record.recorded_at >= self.started_at
        return (record.completion is not None and record.request is not None and not mine
                and bool(record.completion.text) and record.model in self._served())

    def take(self, record: CompletionDigest) -> None:
        """One record read: its answer waits for the engine if the worker can use it."""
        self.read += 1
        if not self.wanted(record):
            return
        assert record.completion is not None
        self._pending.append((draft_scope(record.tenant, self.shared), record.completion.text))
        self._kick()

    async def drained(self) -> None:
        """Wait until every answer read so far is in the engine (tests, and the warm-start log line)."""
        while self._flushing is not None and not self._flushing.done():
            await self._flushing

    async def _read(self, consumer: AIOKafkaConsumer, backlog: dict[TopicPartition, int]) -> None:
        started = time.monotonic()
        while True:
            try:
                if backlog and all([await consumer.position(tp) >= end for tp, end in backlog.items()]):
                    backlog = {}
                if not backlog and not self._backlog_read.is_set():
                    log.info("suffix feed: %d completion records read in %.1f s", self.read,
                             time.monotonic() - started)
                    self.backlog_read()
                fetched = await consumer.getmany(timeout_ms=1000, max_records=_FETCH_RECORDS)
            except Exception:  # best effort: the reader keeps going, as the consumer reconnects
                log.exception("suffix feed: reading the completions failed; retrying")
                await asyncio.sleep(_RETRY_S)
                continue
            for records in fetched.values():
                for record in records:
                    digest = read_digest(record.value, self._max_bytes)
                    if isinstance(digest, Rejection):
                        log.warning("suffix feed: skipping the record at %s:%d: %s", record.topic, record.offset,
                                    digest.message)
                    else:
                        self.take(digest)

    def _kick(self) -> None:
        if (self._call is not None and self._pending and self._backlog_read.is_set()
                and (self._flushing is None or self._flushing.done())):
            self._flushing = asyncio.create_task(self._flush(), name="suffix-feed")

    async def _flush(self) -> None:
        while self._pending and self._call is not None:
            batch = [self._pending.popleft() for _ in range(min(_BATCH, len(self._pending)))]
            try:
                outputs = await asyncio.to_thread(self._tokenize, batch)
                self.learned += await self._call(functools.partial(_learn, outputs=outputs))
            except Exception:  # best effort: a failed batch costs drafts, never requests
                log.exception("suffix feed: %d answers not learned", len(batch))

    def _tokenize(self, batch: list[tuple[str, str]]) -> list[tuple[str, list[int]]]:
        # One call for the batch: a fast tokenizer encodes it in parallel, outside the GIL.
        ids = self._tokenizer([text for _, text in batch], add_special_tokens=False)["input_ids"]
        return [(scope, list(tokens)) for (scope, _), tokens in zip(batch, ids)]


def follows_completions(settings: Settings) -> bool:
    """Whether a worker with these settings drafts by suffix decoding from the completions topic."""
    engine = settings.engine
    spec = engine.speculation
    suffix = spec.method == "suffix" or (spec.method == "eagle" and spec.eagle_suffix)
    return engine.backend != "vllm" and spec.enabled and suffix and spec.suffix_follow_completions


def _learn(engine: Any, outputs: list[tuple[str, list[int]]]) -> int:
    learn = getattr(engine, "learn_outputs", None)  # the vLLM backend has none
    return learn(outputs) if learn is not None else 0
