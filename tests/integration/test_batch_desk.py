"""The edge's batch desk across edges, on the real broker: a batch created through one edge is found at once by
another (the client takes the id it was just given to whichever edge the load balancer picks)."""
from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from schemas.batch import BatchState
from streams.edge.batches.desk import BatchDesk
from streams.kafka import clients
from streams.kafka.compacted_table import FIND_CATCH_UP_S
from streams.wire.errors import EdgeError
from tests.edge_support import edge_options
from tests.kafka_fixtures import kafka_bootstrap, kafka_single  # noqa: F401  (pytest fixtures)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]


def _state(batch_id: str, tenant: str) -> BatchState:
    now = time.time()
    return BatchState(id=batch_id, tenant=tenant, endpoint="/v1/chat/completions", input_file_id="file-x",
                      status="in_progress", created_at=int(now), expires_at=int(now) + 3600, at=now)


def test_a_batch_created_through_one_edge_is_found_at_once_by_another_and_an_unknown_one_is_404(
        kafka_bootstrap: str) -> None:  # noqa: F811
    async def scenario() -> None:
        options = edge_options(kafka_bootstrap, f"t-desk-{uuid.uuid4().hex[:8]}", "desk-a", None)
        await clients.ensure_topics(options.kafka, [options.catalog.batches])
        producer = clients.make_producer(options.kafka, client_id="test-desk")
        await producer.start()
        other = BatchDesk(options, files=None, producer=lambda: producer)  # type: ignore[arg-type]
        await other.start()
        try:
            await asyncio.wait_for(other.book.caught_up.wait(), 30)
            for n in range(5):
                state = _state(f"batch_{uuid.uuid4().hex}", "alice")
                # What the creating edge publishes (BatchDesk._publish), the moment before it answers the client.
                await producer.send_and_wait(options.catalog.batches.name, clients.encode(state),
                                             key=clients.request_key(state.id))
                assert (await other.get("alice", state.id)).id == state.id
            started = time.monotonic()
            with pytest.raises(EdgeError) as unknown:
                await other.get("alice", "batch_nobodymadethis")
            assert unknown.value.status == 404 and time.monotonic() - started < FIND_CATCH_UP_S
        finally:
            await other.stop()
            await producer.stop()

    asyncio.run(scenario())
