"""Replies of a dead edge do not pile up: `specstream topics gc` deletes the reply topics of edges gone for a
while and keeps those of running (announced) edges."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from schemas.events import EdgeAnnouncement
from schemas.topics import HOUR_MS, TopicCatalog
from streams.kafka import clients
from streams.kafka.reply_topics_gc import collect
from tests.kafka_fixtures import kafka_bootstrap, kafka_single  # noqa: F401

pytestmark = [pytest.mark.kafka]

REPO = Path(__file__).resolve().parents[2]
IDLE_MINUTES = 30


async def _setup(bootstrap: str, catalog: TopicCatalog) -> None:
    now_ms = int(time.time() * 1000)
    # Past the test's idle bound (IDLE_MINUTES) but within the reply topics' 1 h retention: a record older than that
    # may be deleted by the broker's retention check at any moment, which would make "crashed-send" empty (kept).
    old_ms = now_ms - HOUR_MS * 3 // 4
    names = ["alive", "gone", "crashed-send", "starting", "busy"]
    await clients.ensure_topics(bootstrap, [catalog.edges, *(catalog.replies(n) for n in names)])
    producer = clients.make_producer(bootstrap, client_id="pytest-gc")
    await producer.start()
    try:
        for edge_id, at in (("alive", time.time()), ("gone", time.time() - 3 * 3600)):
            announcement = EdgeAnnouncement(edge_id=edge_id, reply_topic=catalog.replies(edge_id).name, at=at)
            await producer.send_and_wait(catalog.edges.name, clients.encode(announcement), key=edge_id.encode())
        await producer.send_and_wait(catalog.replies("gone").name, b'{"type":"chunk"}', timestamp_ms=old_ms)
        await producer.send_and_wait(catalog.replies("crashed-send").name, b'{"type":"chunk"}', timestamp_ms=old_ms)
        await producer.send_and_wait(catalog.replies("busy").name, b'{"type":"chunk"}', timestamp_ms=now_ms)
    finally:
        await producer.stop()


def test_topics_gc_deletes_reply_topics_of_gone_edges_only(kafka_bootstrap: str) -> None:  # noqa: F811
    prefix = f"gc-{uuid.uuid4().hex[:8]}"
    catalog = TopicCatalog(prefix=prefix)
    asyncio.run(_setup(kafka_bootstrap, catalog))
    verdicts = {v.edge_id: v for v in asyncio.run(collect(kafka_bootstrap, catalog, idle_s=IDLE_MINUTES * 60))}
    assert {e for e, v in verdicts.items() if v.delete} == {"gone", "crashed-send"}, verdicts
    assert "never announced" in verdicts["starting"].why  # empty, no evidence it is gone: kept

    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECSTREAM_")}
    env.update({"SPECSTREAM_CONFIG": os.devnull, "SPECSTREAM_KAFKA__MANAGE_LOCAL": "false",
                "SPECSTREAM_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap, "SPECSTREAM_KAFKA__TOPIC_PREFIX": prefix})

    def gc(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "streams.cli", "topics", "gc", *args], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    dry = gc("--dry-run", "--idle-minutes", str(IDLE_MINUTES))
    assert f"{prefix}.replies.gone: would delete" in dry and "2 of 5 reply topic(s) would be deleted" in dry, dry
    out = gc("--idle-minutes", str(IDLE_MINUTES))
    assert "2 of 5 reply topic(s) deleted" in out, out
    left = {t for t in asyncio.run(clients.list_topics(kafka_bootstrap)) if t.startswith(prefix + ".replies.")}
    assert left == {catalog.replies(n).name for n in ("alive", "starting", "busy")}
    asyncio.run(clients.delete_topics(kafka_bootstrap, [*left, catalog.edges.name]))
