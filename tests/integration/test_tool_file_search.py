"""The file_search tool on the real broker: a tool runner asks the real rag service (real embedding model, local
on-disk Qdrant) and returns the passage holding a fact of an ingested document; another tenant's store is denied,
an unknown one is not_found, bad arguments never reach the retriever, and a retriever that is not running gives a
timeout result while the runner goes on serving."""
from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from schemas.tools import ToolResult
from streams.kafka import clients
from streams.config import Settings
from streams.config.tools import ToolSettings, ToolsSettings
from streams.rag.service import RagService
from streams.tools.client import ToolClient
from streams.tools.runner import ToolRunner
from tests.kafka_fixtures import kafka_bootstrap  # noqa: F401
from tests.rag_support import publish_store, rag_settings, shared_embedder, wait_status

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.kafka, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
FACTS = [
    "The lighthouse on Vellmar Island was built in 1887 from granite quarried nearby.",
    "Our quarterly revenue grew by twelve percent, driven by subscriptions in Europe.",
    "The recipe calls for two cups of flour, one egg and a pinch of salt.",
]
STORE, OTHER = "vs_acme_docs", "vs_bob_docs"


def with_tools(settings: Settings, *, timeout_s: float, stores: list[str]) -> Settings:
    defaults = ToolsSettings().registry
    search = defaults["file_search"].model_copy(update={"timeout_s": timeout_s, "vector_store_ids": stores})
    registry: dict[str, ToolSettings] = {"calculator": defaults["calculator"], "file_search": search}
    return settings.model_copy(update={"tools": ToolsSettings(registry=registry)})


class Rig:
    def __init__(self, settings: Settings, client: ToolClient) -> None:
        self.settings, self.client = settings, client

    async def call(self, arguments: dict[str, Any], tenant: str = "acme", tool: str = "file_search") -> ToolResult:
        return await self.client.call(self.client.intent(tool, arguments, tenant=tenant), timeout_s=60)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def rig(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Rig]:  # noqa: F811
    settings = with_tools(rag_settings(kafka_bootstrap, tmp_path_factory.mktemp("rag")), timeout_s=20.0, stores=[STORE])
    await clients.ensure_topics(kafka_bootstrap, settings.catalog.shared_topics())
    service = RagService(settings, embedder=shared_embedder())
    await service.start()
    try:
        await publish_store(kafka_bootstrap, settings.catalog, STORE, "acme", FACTS)
        await publish_store(kafka_bootstrap, settings.catalog, OTHER, "bob", ["Bob's secret: the vault code is 4711."])
        for store in (STORE, OTHER):
            await wait_status(kafka_bootstrap, settings.catalog.documents.name, store, "file-facts", "completed")
        async with ToolRunner(settings), ToolClient(settings) as client:
            yield Rig(settings, client)
    finally:
        await service.stop()
        await clients.delete_topics(kafka_bootstrap, [t.name for t in settings.catalog.shared_topics()])


async def test_a_file_search_call_returns_the_passage_holding_the_fact_best_first(rig: Rig) -> None:
    result = await rig.call({"query": "When was the lighthouse built?", "max_num_results": 2})
    assert result.error is None and not result.truncated
    best = result.output["results"][0]
    assert best["file_id"] == "file-facts" and best["filename"] == "facts.md" and best["vector_store_id"] == STORE
    assert "1887" in best["text"] and best["score"] > 0
    assert len(result.output["results"]) == 2


async def test_another_tenants_store_is_denied_whether_configured_or_named_in_the_call(rig: Rig) -> None:
    configured = await rig.call({"query": "lighthouse"}, tenant="bob")
    assert configured.error is not None and configured.error.code == "permission_denied"
    assert f"may not search vector store '{STORE}'" in configured.error.message and configured.output is None
    named = await rig.call({"query": "vault code", "vector_store_ids": [OTHER]}, tenant="acme")
    assert named.error is not None and named.error.code == "permission_denied" and OTHER in named.error.message
    own = await rig.call({"query": "vault code", "vector_store_ids": [OTHER]}, tenant="bob")
    assert own.error is None and "4711" in own.output["results"][0]["text"]


async def test_an_unknown_store_is_not_found_naming_it(rig: Rig) -> None:
    result = await rig.call({"query": "lighthouse", "vector_store_ids": ["vs_nope"]})
    assert result.error is not None and result.error.code == "not_found" and "'vs_nope'" in result.error.message


async def test_arguments_that_fail_the_schema_are_rejected_naming_the_field(rig: Rig) -> None:
    result = await rig.call({"query": "lighthouse", "max_num_results": 500})
    assert result.error is not None and result.error.code == "rejected"
    assert "at max_num_results: 500 is greater than the maximum of 50" in result.error.message


async def test_a_small_output_limit_keeps_the_best_results_and_says_truncated(rig: Rig) -> None:
    tool = rig.settings.tools.registry["file_search"]
    rig.settings.tools.registry["file_search"] = tool.model_copy(update={"max_output_bytes": 400})
    try:
        result = await rig.call({"query": "When was the lighthouse built?", "max_num_results": 3})
    finally:
        rig.settings.tools.registry["file_search"] = tool
    assert result.error is None and result.truncated
    assert len(result.output["results"]) == 1 and "1887" in result.output["results"][0]["text"]
    assert len(json.dumps(result.output, ensure_ascii=False).encode()) <= 400


async def test_specstream_tools_call_file_search_prints_the_passage(rig: Rig) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO),
           "SPECSTREAM_KAFKA__BOOTSTRAP_SERVERS": rig.settings.kafka.bootstrap_servers,
           "SPECSTREAM_KAFKA__TOPIC_PREFIX": rig.settings.kafka.topic_prefix}
    arguments = json.dumps({"query": "How much flour does the recipe need?", "vector_store_ids": [STORE]})
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "streams.cli", "tools", "call", "file_search", arguments, "--tenant", "acme",
        env=env, cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, err.decode()
    result = ToolResult.model_validate_json(out)
    assert "two cups of flour" in result.output["results"][0]["text"]


async def test_a_retriever_that_does_not_answer_is_a_timeout_and_the_runner_keeps_serving(
        kafka_bootstrap: str, tmp_path: Path) -> None:  # noqa: F811
    # A deployment of its own with no rag service running: the store exists, nobody answers its searches.
    settings = with_tools(rag_settings(kafka_bootstrap, tmp_path, prefix=f"t-fs-{uuid.uuid4().hex[:8]}"),
                          timeout_s=2.0, stores=[STORE])
    await clients.ensure_topics(kafka_bootstrap, settings.catalog.shared_topics())
    try:
        await publish_store(kafka_bootstrap, settings.catalog, STORE, "acme")
        async with ToolRunner(settings), ToolClient(settings) as client:
            started = time.monotonic()
            result = await client.call(client.intent("file_search", {"query": "lighthouse"}, tenant="acme"),
                                       timeout_s=60)
            assert result.error is not None and result.error.code == "timeout"
            assert "did not answer within 2 s" in result.error.message and "specstream rag" in result.error.message
            assert 2.0 <= time.monotonic() - started < 15.0
            after = await client.call(client.intent("calculator", {"expression": "6*7"}), timeout_s=60)
            assert after.error is None and after.output == 42
    finally:
        await clients.delete_topics(kafka_bootstrap, [t.name for t in settings.catalog.shared_topics()])
