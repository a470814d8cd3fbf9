"""`specstream topics gc`: delete the reply topics of edges that are gone.

Every edge owns ``<prefix>.replies.<edge_id>``. Replies there have a short
retention (1 h, with hourly segments so it actually applies), so what a dead
edge leaves shrinks to nothing by itself; the empty topic stays until this
command deletes it. A running edge announces itself on ``<prefix>.edges``
every minute (a compacted topic: the latest announcement per edge is kept).

A reply topic is deleted when neither an announcement of its edge nor its
newest record is younger than ``--idle-minutes`` (default 60). A topic that is
empty *and* whose edge never announced itself is kept (an edge that is just
starting, or one older than the announcements): there is no evidence it is
gone. ``specstream send``'s temporary reply topics are deleted by ``send``
itself; one left behind by a killed ``send`` goes once its records are old.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from aiokafka import TopicPartition
from pydantic import ValidationError

from schemas.events import EdgeAnnouncement
from schemas.topics import TopicCatalog
from streams.kafka import clients
from streams.kafka.connection import Connectable


@dataclass(frozen=True)
class Verdict:
    topic: str
    edge_id: str
    announced_at: float | None
    newest_record_at: float | None
    delete: bool
    why: str


async def last_announcements(kafka: Connectable, catalog: TopicCatalog, timeout_s: float = 30.0) -> dict[str, float]:
    """edge_id -> time of its latest announcement."""
    seen: dict[str, float] = {}
    topic = catalog.edges.name
    if topic not in await clients.list_topics(kafka, timeout_s=timeout_s):
        return seen
    for record in await clients.read_partition(kafka, topic, timeout_s=timeout_s):
        try:
            event = clients.decode(record.value or b"", EdgeAnnouncement)
        except ValidationError:
            continue
        seen[event.edge_id] = max(seen.get(event.edge_id, 0.0), event.at)
    return seen


async def _newest_record_times(kafka: Connectable, topics: list[str], timeout_s: float) -> dict[str, float | None]:
    """Per topic, the timestamp of its newest record (partition 0), None when it holds none."""
    out: dict[str, float | None] = {}
    if not topics:
        return out
    consumer = clients.make_consumer(kafka, enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    try:
        tps = [TopicPartition(t, 0) for t in topics]
        begins = await consumer.beginning_offsets(tps)
        ends = await consumer.end_offsets(tps)
        for tp in tps:
            if ends[tp] <= begins[tp]:
                out[tp.topic] = None
                continue
            consumer.assign([tp])
            consumer.seek(tp, ends[tp] - 1)
            batch = await consumer.getmany(tp, timeout_ms=int(timeout_s * 1000))
            records = batch.get(tp, [])
            out[tp.topic] = records[-1].timestamp / 1000 if records else None
    finally:
        await consumer.stop()
    return out


async def collect(kafka: Connectable, catalog: TopicCatalog, *, idle_s: float,
                  now: float | None = None, timeout_s: float = 30.0) -> list[Verdict]:
    now = time.time() if now is None else now
    prefix = catalog.replies("").name  # "<prefix>.replies."
    topics = [t for t in await clients.list_topics(kafka, timeout_s=timeout_s) if t.startswith(prefix)
              and len(t) > len(prefix)]
    announced = await last_announcements(kafka, catalog, timeout_s)
    newest = await _newest_record_times(kafka, topics, timeout_s)
    verdicts: list[Verdict] = []
    for topic in sorted(topics):
        edge_id = topic[len(prefix):]
        seen, record = announced.get(edge_id), newest.get(topic)
        latest = max([t for t in (seen, record) if t is not None], default=None)
        if latest is None:
            verdicts.append(Verdict(topic, edge_id, seen, record, False, "empty and never announced: kept"))
        elif now - latest < idle_s:
            verdicts.append(Verdict(topic, edge_id, seen, record, False, f"active {now - latest:.0f}s ago"))
        else:
            verdicts.append(Verdict(topic, edge_id, seen, record, True, f"idle for {now - latest:.0f}s"))
    return verdicts


async def gc(kafka: Connectable, catalog: TopicCatalog, *, idle_s: float, dry_run: bool = False,
             timeout_s: float = 30.0) -> list[Verdict]:
    verdicts = await collect(kafka, catalog, idle_s=idle_s, timeout_s=timeout_s)
    doomed = [v.topic for v in verdicts if v.delete]
    if doomed and not dry_run:
        await clients.delete_topics(kafka, doomed, timeout_s=timeout_s)
    return verdicts


def run_gc(settings: object, *, idle_minutes: float, dry_run: bool) -> int:
    """The CLI's `topics gc`: one line per reply topic, what was done and why."""
    verdicts = asyncio.run(gc(settings.kafka, settings.catalog,  # type: ignore[attr-defined]
                              idle_s=idle_minutes * 60, dry_run=dry_run))
    for v in verdicts:
        action = ("would delete" if dry_run else "deleted") if v.delete else "kept"
        print(f"{v.topic}: {action} ({v.why})")
    deleted = sum(v.delete for v in verdicts)
    print(f"{deleted} of {len(verdicts)} reply topic(s) {'would be ' if dry_run else ''}deleted")
    return 0
