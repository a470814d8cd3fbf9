"""Reading what evaluation works from: recorded completions (Kafka), eval samples (Kafka or a JSONL file).

Records are read from one point (a time or an offset) to the end the topic had when reading began, so a replay
works on a fixed set even while the deployment keeps recording. A request recorded twice (regenerated after a
redelivery) counts once: the first record wins.
"""
from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from aiokafka import TopicPartition
from pydantic import BaseModel, ValidationError

from schemas.events import ChatMessage, CompletionRecord, EvalSample, FinishReason
from streams.kafka import clients
from streams.kafka.connection import Connectable

ModelT = TypeVar("ModelT", bound=BaseModel)
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_INTERRUPTED: tuple[FinishReason, ...] = ("abort", "deadline")


class SourceError(ValueError):
    """Evaluation input that cannot be used (message is one line naming the place)."""


def parse_duration(text: str) -> float:
    """'90s', '15m', '2h', '1d' -> seconds."""
    unit = text[-1:].lower()
    try:
        if unit not in _DURATION_UNITS:
            raise ValueError
        value = float(text[:-1])
    except ValueError:
        raise SourceError(f"expected a duration such as 30m, 2h or 1d, got {text!r}") from None
    return value * _DURATION_UNITS[unit]


@dataclass
class Read:
    """Events of one topic, in offset order, with what was left out and why."""

    events: list[Any] = field(default_factory=list)
    unreadable: int = 0


async def read_topic(kafka: Connectable, topic: str, model: type[ModelT], *, since_s: float | None = None,
                     from_offset: int | None = None, timeout_s: float = 60.0) -> Read:
    """Partition 0 of ``topic`` from a time (``since_s`` seconds ago), an offset, or its start, up to its end now."""
    tp = TopicPartition(topic, 0)
    consumer = clients.make_consumer(kafka, enable_auto_commit=False, auto_offset_reset="earliest",
                                      max_partition_fetch_bytes=16 * 1024 * 1024)
    await consumer.start()
    read = Read()
    try:
        if topic not in await consumer.topics():
            raise SourceError(f"topic {topic} does not exist (another kafka.topic_prefix? nothing recorded yet?)")
        consumer.assign([tp])
        end = (await consumer.end_offsets([tp]))[tp]
        start = (await consumer.beginning_offsets([tp]))[tp]
        if from_offset is not None:
            start = max(start, from_offset)
        elif since_s is not None:
            found = (await consumer.offsets_for_times({tp: int((time.time() - since_s) * 1000)}))[tp]
            start = found.offset if found is not None else end
        consumer.seek(tp, start)
        deadline = time.monotonic() + timeout_s
        while start < end and await consumer.position(tp) < end and time.monotonic() < deadline:
            batch = await consumer.getmany(tp, timeout_ms=500)
            for record in batch.get(tp, []):
                if record.offset >= end:
                    break
                try:
                    read.events.append(clients.decode(record.value or b"", model))
                except ValidationError:
                    read.unreadable += 1
    finally:
        await consumer.stop()
    return read


@dataclass(frozen=True)
class Selection:
    """The recorded requests a replay uses, and how many were left out for each reason."""

    records: list[CompletionRecord]
    duplicates: int
    other_tenants: int
    prompt_not_logged: int
    interrupted: int
    unreadable: int

    def counts(self) -> dict[str, int]:
        return {"replayable": len(self.records), "duplicates_dropped": self.duplicates,
                "other_tenants": self.other_tenants, "prompt_not_logged": self.prompt_not_logged,
                "interrupted": self.interrupted, "unreadable": self.unreadable}


def select_records(read: Read, *, tenant: str | None = None, limit: int | None = None) -> Selection:
    """First record per request_id, of one tenant if given, with its request (prompt) logged; at most ``limit``.

    Answers cut short by their client (cancelled) or by a deadline are left out: their text says how far the
    generation got before it was stopped, not what the model answers, so nothing can match it.
    """
    seen: set[str] = set()
    kept: list[CompletionRecord] = []
    duplicates = other_tenants = dropped = interrupted = 0
    for record in read.events:
        if record.request_id in seen:
            duplicates += 1
            continue
        seen.add(record.request_id)
        if tenant is not None and record.tenant != tenant:
            other_tenants += 1
        elif record.request is None:
            dropped += 1
        elif record.completion is not None and record.completion.finish_reason in _INTERRUPTED:
            interrupted += 1
        elif limit is None or len(kept) < limit:
            kept.append(record)
    return Selection(kept, duplicates, other_tenants, dropped, interrupted, read.unreadable)


def input_key(prompt: str | None, messages: Iterable[ChatMessage] | None) -> str:
    """What matches a reference answer to a request: its exact input, as canonical JSON."""
    if messages is not None:
        return json.dumps([m.model_dump() for m in messages], sort_keys=True)
    return json.dumps(prompt)


def load_samples(path: Path) -> list[EvalSample]:
    """A JSONL file of samples: {"input": "..." | "messages": [...], "reference": "...", "tags": [...], "id": "..."}.

    ``input`` is a user message (chat); ``prompt`` a raw prompt; ``id`` defaults to the line number.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise SourceError(f"cannot read {path}: {error.strerror or error}") from None
    samples = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            if not isinstance(raw, dict):
                raise ValueError("expected a JSON object")
            samples.append(_sample(raw, number))
        except ValidationError as error:
            raise SourceError(f"{path} line {number}: {clients.validation_summary(error)}") from None
        except ValueError as error:
            raise SourceError(f"{path} line {number}: {error}") from None
    if not samples:
        raise SourceError(f"{path}: no samples")
    repeated = sorted(i for i, n in Counter(s.sample_id for s in samples).items() if n > 1)
    if repeated:
        raise SourceError(f"{path}: sample ids must be unique; repeated: {', '.join(repeated)}")
    return samples


def _sample(raw: dict[str, Any], number: int) -> EvalSample:
    body = dict(raw)
    sample_id = str(body.pop("id", body.pop("sample_id", f"line-{number}")))
    if "input" in body:
        body["messages"] = [{"role": "user", "content": body.pop("input")}]
    return EvalSample(sample_id=sample_id, **body)
