"""The file_search tool's round trip, side by side with the same search asked of the retriever directly.

    python -m bench.file_search_bench              # 100 calls per row
    python -m bench.file_search_bench --calls 20   # a smoke run

A rag service (real embedding model, local Qdrant in a temporary folder), a tool runner and the clients run in
this process, on a topic prefix of their own on the broker the configuration names (`--config`,
SPECSTREAM_KAFKA__*). One store of the `bench` tenant holds a few facts; each row is timed call by call, one at a
time:

* `retriever direct`: a search request on the retrieval topic, its answer on a reply topic (what the edge's search
  endpoint costs on the bus);
* `file_search tool`: a ToolIntent to the runner, which checks the store's tenant and asks the retriever as above,
  then its ToolResult (the tool's overhead is the difference);
* `calculator tool`: the tool runner's bus round trip alone, for scale.
"""
from __future__ import annotations

import argparse
import asyncio
import tempfile
import uuid
from pathlib import Path

from bench.tools_bench import _percentiles, _time_async
from streams.kafka import clients
from streams.config import Settings, load_settings
from streams.config.tools import ToolsSettings
from streams.rag.client import RagClient
from streams.rag.service import RagService
from streams.tools.client import ToolClient
from streams.tools.runner import ToolRunner

# The parser's output as the rag tests publish it: this measures searching, not parsing.
from tests.rag_support import publish_store, wait_status

STORE = "vs_bench_facts"
FACTS = [
    "The lighthouse on Vellmar Island was built in 1887 from granite quarried nearby.",
    "Our quarterly revenue grew by twelve percent, driven by subscriptions in Europe.",
    "The recipe calls for two cups of flour, one egg and a pinch of salt.",
    "Locker B-17 in the east wing holds the spare keys to the server room.",
]
QUERY = "When was the lighthouse built?"


def bench_settings(settings: Settings, state_dir: Path) -> Settings:
    prefix = f"{settings.kafka.topic_prefix}-fsbench-{uuid.uuid4().hex[:6]}"
    tools = ToolsSettings(registry={name: tool for name, tool in ToolsSettings().registry.items() if name != "python"})
    return settings.model_copy(update={
        "kafka": settings.kafka.model_copy(update={"topic_prefix": prefix}),
        "rag": settings.rag.model_copy(update={"state_dir": str(state_dir)}), "tools": tools})


async def ingest(settings: Settings) -> None:
    catalog = settings.catalog
    await publish_store(settings.kafka.bootstrap_servers, catalog, STORE, "bench", FACTS)
    await wait_status(settings.kafka.bootstrap_servers, catalog.documents.name, STORE, "file-facts", "completed")


async def run(settings: Settings, calls: int) -> None:
    catalog = settings.catalog
    await clients.ensure_topics(settings.kafka, catalog.shared_topics())
    service = RagService(settings)
    await service.start()
    try:
        await ingest(settings)
        async with ToolRunner(settings), ToolClient(settings) as tools, \
                RagClient.session(settings.kafka, catalog, documents=False) as rag:
            async def direct() -> None:
                await rag.search([STORE], tenant="bench", query=QUERY, timeout_s=60)

            async def tool(name: str, arguments: dict[str, object]) -> None:
                result = await tools.call(tools.intent(name, arguments, tenant="bench"), timeout_s=60)
                if result.error is not None:
                    raise RuntimeError(f"{name} failed: {result.error.code}: {result.error.message}")

            rows = [("retriever direct", direct),
                    ("file_search tool", lambda: tool("file_search", {"query": QUERY, "vector_store_ids": [STORE]})),
                    ("calculator tool", lambda: tool("calculator", {"expression": "6 * 7"}))]
            for _, call in rows:
                await call()  # warm-up: group assignment, the runner's rag session, the first embedding
            print(f"round trip, one call at a time (topics {settings.kafka.topic_prefix}.*):")
            for label, call in rows:
                print(f"  {label:<17} {_percentiles(await _time_async(call, calls))}")
    finally:
        await service.stop()
        await clients.delete_topics(settings.kafka, [t.name for t in catalog.shared_topics()])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="configuration file (the broker)")
    parser.add_argument("--calls", type=int, default=100, help="calls per row")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="file-search-bench-") as state_dir:
        asyncio.run(run(bench_settings(load_settings(args.config), Path(state_dir)), args.calls))


if __name__ == "__main__":
    main()
