"""A model's call of the server-side `file_search` tool, end to end with the official `openai` client: edge ->
worker -> tool-intents -> tool runner -> retrieval -> rag service (real embedder, local Qdrant) -> tool-results ->
worker -> the next round -> edge, on the real broker and model.

The default model is tiny and was not trained for tools, so the test names the tool in `tool_choice` and the grammar
makes it call `file_search` (as the python tool's test does). The store searched is the tool's configured one; it
belongs to the API key's tenant and holds one fact, so whatever query the model writes finds it.
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import OpenAI

from streams.kafka import clients
from streams.config import Settings
from streams.config.tools import ToolsSettings
from streams.testing.stack import DEFAULT_MODEL as MODEL
from streams.testing.stack import Stack, running_stack, spawn_process
from tests.edge_support import WORKER_ENV, forced_server_call
from tests.kafka_fixtures import kafka_bootstrap, kafka_single  # noqa: F401  (pytest fixtures)
from tests.rag_support import publish_store, wait_status

pytestmark = [pytest.mark.kafka, pytest.mark.model, pytest.mark.timeout(900)]

STORE = "vs_e2e_facts"
FACT = "The lighthouse on Vellmar Island was built in 1887 from granite quarried nearby."
SEARCH_TOOL = {"type": "function", "function": {
    "name": "file_search", "description": "Search the documents.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string", "minLength": 1, "maxLength": 40}},
                   "required": ["query"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "When was the lighthouse on Vellmar Island built? Search the documents."}]


def registry_env() -> str:
    """Only file_search (no python: this runner needs no sandbox), searching the test's store."""
    tool = ToolsSettings().registry["file_search"].model_copy(update={"vector_store_ids": [STORE], "timeout_s": 30.0})
    return json.dumps({"file_search": tool.model_dump(mode="json")})


async def ingest(stack: Stack) -> None:
    """The store (the key's tenant, `test`) and its one document, as the vector store API and the parser publish them."""
    settings = Settings(kafka={"bootstrap_servers": stack.bootstrap_servers, "topic_prefix": stack.topic_prefix})
    catalog = settings.catalog
    await clients.ensure_topics(settings.kafka, catalog.shared_topics())
    await publish_store(stack.bootstrap_servers, catalog, STORE, "test", [FACT])
    await wait_status(stack.bootstrap_servers, catalog.documents.name, STORE, "file-facts", "completed", timeout_s=240)


@pytest.fixture(scope="module")
def stack(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:  # noqa: F811
    logs: Path = tmp_path_factory.mktemp("stack")

    def start_rag_and_tool_runner(stack: Stack) -> None:
        stack.processes.append(spawn_process("rag", ["rag"], stack.env, logs))
        stack.processes.append(spawn_process("tool-runner", ["tool-runner"], stack.env, logs))

    env = {**WORKER_ENV, "SPECSTREAM_TOOLS__MAX_ROUNDS": "1", "SPECSTREAM_TOOLS__REGISTRY": registry_env(),
           "SPECSTREAM_RAG__STATE_DIR": str(tmp_path_factory.mktemp("rag"))}
    with running_stack(kafka_bootstrap, env=env, prepare=start_rag_and_tool_runner, log_dir=logs) as running:
        asyncio.run(ingest(running))
        yield running


def test_a_model_called_file_search_is_run_by_the_tool_runner_and_its_passages_reach_the_answer(stack: Stack) -> None:
    client = OpenAI(base_url=stack.base_url + "/v1", api_key=stack.api_key, max_retries=0, timeout=300)
    _, results = forced_server_call(client, MODEL, ASK, SEARCH_TOOL, max_tokens=60)
    assert results[0]["name"] == "file_search" and results[0]["error"] is None, results[0]
    found = results[0]["output"]["results"]
    assert found[0]["file_id"] == "file-facts" and found[0]["vector_store_id"] == STORE and "1887" in found[0]["text"]
