"""The README's tour works as written: its raw-Kafka client, run unchanged but for where the broker is and which
topic prefix the test worker serves, gets a streamed answer from a real worker on the real broker."""
from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from tests.conftest import WorkerHarness

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.kafka, pytest.mark.model]

README = Path(__file__).resolve().parents[2] / "README.md"
SETTINGS_LINE = 'BOOTSTRAP, PREFIX = "127.0.0.1:9092", "specstream"'


def raw_kafka_example() -> str:
    """The README's Python block that publishes to the request topic itself."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    example = next(b for b in blocks if "AIOKafkaProducer" in b)
    assert SETTINGS_LINE in example, "the README example's broker and prefix line moved: update this test"
    return example


async def delete_topics_starting(bootstrap: str, start: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        names = [t for t in await admin.list_topics() if t.startswith(start)]
        if names:
            await admin.delete_topics(names)
    finally:
        await admin.close()


async def test_the_readme_client_publishes_a_request_to_kafka_and_prints_the_streamed_answer(
        worker_harness: WorkerHarness) -> None:
    prefix = worker_harness.settings.kafka.topic_prefix
    script = raw_kafka_example().replace(
        SETTINGS_LINE, f'BOOTSTRAP, PREFIX = "{worker_harness.bootstrap_servers}", "{prefix}"')
    try:
        done = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", script], capture_output=True,
                                       text=True, timeout=180)
    finally:
        await delete_topics_starting(worker_harness.bootstrap_servers, f"{prefix}.replies.tour-")
    assert done.returncode == 0, done.stderr
    text, _, last = done.stdout.rstrip("\n").rpartition("\n")
    assert text.strip(), "no streamed text before the completion line"
    finish = re.fullmatch(r" (length|stop) \{.*'completion_tokens': (\d+).*\}", last)
    assert finish and 0 < int(finish.group(2)) <= 32, last  # the example asks for at most 32 tokens
