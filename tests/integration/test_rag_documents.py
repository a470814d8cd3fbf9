"""Documents to grounded answers, end to end, through the official `openai` client: real broker, real processes
(`specstream parser`, `specstream rag` with the real embedding model and a local Qdrant, an engine worker with the
default model), an edge in the test process.

A DOCX, an HTML page, a Markdown file and a PDF are uploaded and put in a store; their files go `completed`; search
finds the passage holding a fact that only the PDF has; a chat completion with the file_search tool answers with a
file_citation whose span of the PDF's extracted text holds that fact. Bad files end `failed` with the parser's
precise last_error and leave the rest of the store as it was.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from openai import OpenAI
from websockets.sync.client import connect as ws_connect

from streams.edge.keys import create_key
from streams.edge.server import serve_in_thread
from streams.rag.parsing.extract import extract
from streams.testing.stack import DEFAULT_MODEL as MODEL
from streams.testing.stack import REPO, Stack, _stop, spawn_process, stack_env
from tests import document_files
from tests.edge_support import edge_options, shared_worker, wait_ready
from tests.kafka_fixtures import kafka_bootstrap, kafka_single  # noqa: F401  (pytest fixtures)
from tests.rag_stack import running_rag

pytestmark = [pytest.mark.kafka, pytest.mark.model, pytest.mark.timeout(900)]

FACT = "The harbour master's parrot is called Marmalade and speaks Portuguese."
QUESTION = "What is the harbour master's parrot called?"
PDF_PAGES = ["Annual report of the Vellmar harbour authority, 2025.", FACT]
DOCUMENTS = {
    "bakery.docx": document_files.docx(["The bakery on Quay Street opens at six every morning.",
                                        "Its rye bread sells out before noon on Saturdays."]),
    "partitions.html": document_files.HTML_WITH_BOILERPLATE,
    "garden.md": b"# Garden notes\n\nTomatoes need six hours of sun a day.\n\nWater the basil in the morning.\n",
    "report.pdf": document_files.pdf(PDF_PAGES),
}
SMALL_CHUNKS = {"type": "static", "static": {"max_chunk_size_tokens": 100, "chunk_overlap_tokens": 20}}


@pytest.fixture(scope="session")
def edge_worker(kafka_bootstrap: str) -> Iterator[Stack]:  # noqa: F811
    yield from shared_worker(kafka_bootstrap)


@dataclass
class Docs:
    client: OpenAI
    base_url: str
    key: str
    env: dict[str, str]


@pytest.fixture(scope="module")
def docs(kafka_bootstrap: str, edge_worker: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Docs]:  # noqa: F811
    root = tmp_path_factory.mktemp("rag-docs")
    keys_file: Path = root / "keys.json"
    key, _ = create_key(keys_file, "rag-docs")
    prefix = edge_worker.topic_prefix
    files_env = {"SPECSTREAM_FILES__DIR": str(root / "files")}
    env = stack_env(kafka_bootstrap, prefix, "unused", 1, files_env)
    parser = spawn_process("parser", ["parser"], env, root)
    # The worker's context is 512 tokens: two passages of at most 100 tokens fit with the question and the answer.
    rag_env = {"SPECSTREAM_RAG__MAX_PROMPT_CHARS": "900"}
    try:
        with running_rag(kafka_bootstrap, prefix, root / "state", root, env=rag_env):
            with serve_in_thread(edge_options(kafka_bootstrap, prefix, f"docs-{uuid.uuid4().hex[:6]}", keys_file)) as edge:
                wait_ready(edge.base_url, edge_worker)
                yield Docs(OpenAI(base_url=edge.base_url + "/v1", api_key=key, max_retries=0, timeout=300),
                           edge.base_url, key, env)
    finally:
        _stop(parser, 20.0)


def settle(client: OpenAI, store_id: str, timeout_s: float = 240.0) -> dict[str, object]:
    """Each file of the store once it left in_progress."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        files = client.vector_stores.files.list(vector_store_id=store_id, limit=100).data
        if files and all(f.status != "in_progress" for f in files):
            return {f.id: f for f in files}
        time.sleep(1.0)
    raise AssertionError(f"files of {store_id} still in progress after {timeout_s:.0f} s")


def upload(client: OpenAI, name: str, data: bytes) -> str:
    return client.files.create(file=(name, data), purpose="assistants").id


def test_four_formats_are_indexed_search_finds_the_fact_and_chat_cites_it(docs: Docs) -> None:
    client = docs.client
    ids = {name: upload(client, name, data) for name, data in DOCUMENTS.items()}
    store = client.vector_stores.create(name="harbour", file_ids=list(ids.values()), chunking_strategy=SMALL_CHUNKS)
    files = settle(client, store.id)
    assert {f.status for f in files.values()} == {"completed"}, {i: f.last_error for i, f in files.items()}

    found = client.vector_stores.search(store.id, query=QUESTION, max_num_results=4)
    assert found.data[0].file_id == ids["report.pdf"] and found.data[0].filename == "report.pdf"
    assert "Marmalade" in found.data[0].content[0].text

    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": QUESTION}], max_tokens=24, temperature=0,
        tools=[{"type": "file_search", "vector_store_ids": [store.id], "max_num_results": 2}],  # type: ignore[list-item]
    )
    body = raw.http_response.json()
    message = body["choices"][0]["message"]
    assert message["content"], "no answer"
    cited = [a for a in message["annotations"] if a["type"] == "file_citation" and a["file_id"] == ids["report.pdf"]]
    assert cited, message["annotations"]
    text = extract(DOCUMENTS["report.pdf"], "report.pdf").text
    span = text[cited[0]["char_start"]:cited[0]["char_end"]]
    assert "Marmalade" in span and span == cited[0]["quote"] and cited[0]["filename"] == "report.pdf"
    assert body["specstream"]["index_versions"] == {store.id: 1}



def test_the_responses_api_grounds_its_answer_with_the_file_search_tool(docs: Docs) -> None:
    client = docs.client
    report = upload(client, "report.pdf", DOCUMENTS["report.pdf"])
    store = client.vector_stores.create(name="harbour-responses", file_ids=[report], chunking_strategy=SMALL_CHUNKS)
    assert {f.status for f in settle(client, store.id).values()} == {"completed"}
    response = client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=24, temperature=0, store=False,
                                       tools=[{"type": "file_search", "vector_store_ids": [store.id],
                                               "max_num_results": 2}])
    [message] = response.output
    assert message.type == "message" and message.content[0].text, "no answer"
    cited = [a for a in message.content[0].annotations if a.type == "file_citation" and a.file_id == report]
    assert cited and cited[0].filename == "report.pdf"


BAD_FILES = {
    "tool.exe": (b"MZ\x90\x00binary", "unsupported_file", "not supported"),
    "empty.md": (b"", "invalid_file", "is empty"),
    "broken.pdf": (b"%PDF-1.4\nthis is not a pdf", "invalid_file", "corrupt"),
    "locked.pdf": (document_files.encrypted_pdf(["secret text"]), "invalid_file", "encrypted"),
    "blank.pdf": (document_files.pdf([""]), "invalid_file", "no extractable text"),
}


def test_bad_files_fail_with_a_precise_last_error_and_leave_the_store_untouched(docs: Docs) -> None:
    client = docs.client
    good = upload(client, "garden.md", DOCUMENTS["garden.md"])
    store = client.vector_stores.create(name="mixed", file_ids=[good], chunking_strategy=SMALL_CHUNKS)
    assert settle(client, store.id)[good].status == "completed"
    before = client.vector_stores.search(store.id, query="How much sun do tomatoes need?").data

    bad = {name: upload(client, name, data) for name, (data, _, _) in BAD_FILES.items()}
    batch = client.vector_stores.file_batches.create(vector_store_id=store.id, file_ids=list(bad.values()))
    files = settle(client, store.id)
    for name, (_, code, words) in BAD_FILES.items():
        error = files[bad[name]].last_error
        assert files[bad[name]].status == "failed" and error is not None, name
        assert error.code == code and words in error.message, (name, error)
    assert files[good].status == "completed"
    counts = client.vector_stores.retrieve(store.id).file_counts
    assert (counts.completed, counts.failed, counts.total) == (1, len(BAD_FILES), 1 + len(BAD_FILES))
    assert client.vector_stores.file_batches.retrieve(batch.id, vector_store_id=store.id).file_counts.failed == 5
    after = client.vector_stores.search(store.id, query="How much sun do tomatoes need?").data
    assert [(r.file_id, r.content[0].text) for r in after] == [(r.file_id, r.content[0].text) for r in before]


def test_the_websocket_and_specstream_send_ground_answers_in_a_store(docs: Docs) -> None:
    pdf = upload(docs.client, "report.pdf", DOCUMENTS["report.pdf"])
    store = docs.client.vector_stores.create(name="ws", file_ids=[pdf], chunking_strategy=SMALL_CHUNKS)
    assert settle(docs.client, store.id)[pdf].status == "completed"
    tool = {"type": "file_search", "vector_store_ids": [store.id], "max_num_results": 2}
    url = docs.base_url.replace("http://", "ws://") + "/v1/ws"
    with ws_connect(url, additional_headers={"Authorization": f"Bearer {docs.key}"}) as ws:
        ws.send(json.dumps({"id": "q", "model": MODEL, "messages": [{"role": "user", "content": QUESTION}],
                            "max_tokens": 16, "temperature": 0, "tools": [tool]}))
        while (frame := json.loads(ws.recv(timeout=300)))["type"] != "done":
            assert frame["type"] == "chunk", frame
    assert frame["index_versions"] == {store.id: 1}
    assert any(a["file_id"] == pdf and "Marmalade" in a["quote"] for a in frame["annotations"]), frame

    # The CLI goes straight onto the bus, as the operator: the store's tenant is named.
    sent = subprocess.run([sys.executable, "-m", "streams.cli", "send", QUESTION, "--vector-store", store.id,
                           "--tenant", "rag-docs", "--max-tokens", "16", "--max-results", "2"],
                          cwd=REPO, env=docs.env, text=True, capture_output=True, timeout=300)
    assert sent.returncode == 0, sent.stderr
    assert "grounded on" in sent.stderr and f"report.pdf ({pdf})" in sent.stderr, sent.stderr
