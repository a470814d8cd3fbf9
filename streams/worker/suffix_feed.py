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
- only answers of a model this worker serves (another model's text would rarely match).

Memory is bounded twice: the engine's index by its settings (suffix_max_outputs, suffix_max_output_tokens), and
the answers waiting here for the engine thread by the same count of outputs (the oldest dropped: the index would
evict them first anyway). Records are tokenized off the event loop and handed over in batches between engine steps.

At start the topic's backlog (records written before this worker started) is read whole before anything is handed
over: the index keeps only the newest outputs, so learning the older ones would be undone by eviction (100k
records: 43 s from the worker's start to a complete index, learning each as read; 18.5 s reading them first).
"""
from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from schemas.events import CompletionRecord
from schemas.topics import TopicCatalog
from streams.config import Settings
from streams.service import Listener
from streams.worker.intake import draft_scope

log = logging.getLogger("specstream.worker.suffix_feed")

_BATCH = 512  # answers per hand-over: one engine-thread call each
BACKLOG_IDLE_S = 0.25  # no record from before the start read for this long: the backlog is read

EngineCall = Callable[[Callable[[Any], Any]], Awaitable[Any]]


class SuffixFeed:
    def __init__(self, worker_id: str, *, shared: bool, served: Callable[[], list[str]],
                 started_at: float | None = None, max_outputs: int = 10_000) -> None:
        self.worker_id = worker_id
        self.started_at = time.time() if started_at is None else started_at
        self.shared = shared
        self._served = served
        # (scope, text), at most what the index keeps (engine.speculation.suffix_max_outputs)
        self._pending: deque[tuple[str, str]] = deque(maxlen=max_outputs)
        self._backlog_read_at = 0.0  # monotonic time the last record from before the start was read
        self._call: EngineCall | None = None
        self._tokenizer: Any = None
        self._flushing: asyncio.Task[None] | None = None
        self.read = 0  # records seen on the topic
        self.learned = 0  # answers the engine took

    @classmethod
    def from_settings(cls, settings: Settings, worker_id: str, *, served: Callable[[], list[str]]) -> SuffixFeed | None:
        """The feed of a worker drafting by suffix decoding from the completions topic; None for any other."""
        if not follows_completions(settings):
            return None
        spec = settings.engine.speculation
        return cls(worker_id, shared=spec.suffix_shared, served=served, max_outputs=spec.suffix_max_outputs)

    def listeners(self, catalog: TopicCatalog) -> list[Listener[CompletionRecord]]:
        """What the worker reads for it: the completions topic, from its start at every start."""
        return [Listener(catalog.completions, CompletionRecord, self.on_record, from_beginning=True, in_batches=True)]

    def attach(self, call: EngineCall, tokenizer: Any) -> None:
        """The engine is loaded: answers read before now are handed over from here on."""
        self._call, self._tokenizer = call, tokenizer
        self._kick()

    def wanted(self, record: CompletionRecord) -> bool:
        mine = record.worker_id == self.worker_id and record.recorded_at >= self.started_at
        return (record.completion is not None and record.request is not None and not mine
                and bool(record.completion.text) and record.model in self._served())

    async def on_record(self, record: CompletionRecord) -> None:
        """A Listener's handler: best effort, never raises for a record it cannot use."""
        self.read += 1
        if record.recorded_at < self.started_at:
            self._backlog_read_at = time.monotonic()
        if not self.wanted(record):
            return
        assert record.completion is not None
        self._pending.append((draft_scope(record.tenant, self.shared), record.completion.text))
        self._kick()

    async def drained(self) -> None:
        """Wait until every answer read so far is in the engine (tests, and the warm-start log line)."""
        while self._flushing is not None and not self._flushing.done():
            await self._flushing

    def _kick(self) -> None:
        if self._call is not None and self._pending and (self._flushing is None or self._flushing.done()):
            self._flushing = asyncio.create_task(self._flush(), name="suffix-feed")

    async def _flush(self) -> None:
        while (backlog := self._backlog_read_at + BACKLOG_IDLE_S - time.monotonic()) > 0:
            await asyncio.sleep(backlog)  # still reading the backlog: only its newest answers will be kept
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
