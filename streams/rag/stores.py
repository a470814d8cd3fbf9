"""The vector stores' table as the rag service's consumers look stores up in it."""
from __future__ import annotations

from collections.abc import Sequence

from schemas.retrieval import VectorStoreRecord
from streams.kafka.compacted_table import CompactedTable


async def records_of(stores: CompactedTable[VectorStoreRecord],
                     ids: Sequence[str]) -> dict[str, VectorStoreRecord | None]:
    """Each store's record, None for a store that does not exist.

    A store not seen yet may have been created a moment ago (its record published before the request that names
    it): only then is the table caught up, which costs a round trip to the broker."""
    if any(stores.get(store) is None for store in ids):
        await stores.caught_up()
    return {store: stores.get(store) for store in ids}
