"""OpenAI's Files API, checked with the official `openai` client against real edges on the real Kafka.

Upload, list (purpose filter, cursor page), retrieve, download and delete; a second edge (as after a restart)
serves the same files from the compacted files topic; the size limit, a bad purpose, an unknown or another
tenant's id, a purpose's validator refusing a file, and bytes changed on disk are precise errors.
"""
from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from openai import OpenAI

from streams.config import FilesSettings
from streams.edge.keys import create_key
from streams.edge.server import RunningEdge, serve_in_thread
from streams.edge.settings import EdgeOptions
from streams.files.purposes import InvalidFile, register_validator, unregister_validator
from streams.kafka.compacted_table import FIND_CATCH_UP_S
from tests.edge_support import edge_options
from tests.kafka_fixtures import kafka_bootstrap, kafka_single  # noqa: F401  (pytest fixtures)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]

MAX_BYTES = 64 * 1024


def _options(bootstrap: str, prefix: str, keys_file: Path, blobs: Path) -> EdgeOptions:
    options = edge_options(bootstrap, prefix, f"files-{uuid.uuid4().hex[:6]}", keys_file)
    files = FilesSettings(dir=str(blobs), max_bytes=MAX_BYTES)
    return EdgeOptions(options.settings.model_copy(update={"files": files}))


@pytest.fixture(scope="module")
def setup(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:  # noqa: F811
    keys_file = tmp_path_factory.mktemp("keys") / "keys.json"
    blobs = tmp_path_factory.mktemp("blobs")
    key, _ = create_key(keys_file, "files-tests")
    other, _ = create_key(keys_file, "someone-else")
    prefix = f"t-files-{uuid.uuid4().hex[:8]}"
    with serve_in_thread(_options(kafka_bootstrap, prefix, keys_file, blobs)) as edge:
        yield {"edge": edge, "key": key, "other": other, "prefix": prefix, "keys_file": keys_file, "blobs": blobs,
               "kafka": kafka_bootstrap}


def _client(edge: RunningEdge, key: str) -> OpenAI:
    return OpenAI(base_url=edge.base_url + "/v1", api_key=key, max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def client(setup: dict) -> OpenAI:
    return _client(setup["edge"], setup["key"])


def test_a_file_round_trips_through_upload_list_retrieve_content_and_delete(client: OpenAI, tmp_path: Path) -> None:
    path = tmp_path / "notes.md"
    path.write_bytes(b"# Kafka\n\nA distributed log.\n")
    created = client.files.create(file=path.open("rb"), purpose="assistants")
    assert created.id.startswith("file-") and created.object == "file"
    assert (created.filename, created.bytes, created.purpose) == ("notes.md", path.stat().st_size, "assistants")
    assert abs(created.created_at - time.time()) < 60
    assert client.files.retrieve(created.id) == created
    assert client.files.content(created.id).read() == path.read_bytes()
    assert created.id in [f.id for f in client.files.list()]
    deleted = client.files.delete(created.id)
    assert (deleted.id, deleted.object, deleted.deleted) == (created.id, "file", True)
    assert created.id not in [f.id for f in client.files.list()]
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(created.id)


def test_listing_filters_by_purpose_and_pages_newest_first(client: OpenAI) -> None:
    ids = [client.files.create(file=(f"{i}.jsonl", b"{}\n"), purpose="user_data").id for i in range(3)]
    other = client.files.create(file=("x.txt", b"x"), purpose="assistants").id
    listed = [f.id for f in client.files.list(purpose="user_data")]
    assert set(ids) <= set(listed) and other not in listed
    first = client.files.list(purpose="user_data", limit=2, order="asc")
    assert len(first.data) == 2 and first.has_more
    everything = [f.id for f in client.files.list(purpose="user_data", limit=2, order="asc")]  # follows the cursor
    assert everything == [f.id for f in client.files.list(purpose="user_data", order="asc")]
    raw = client.files.with_raw_response.list(purpose="user_data", limit=1).http_response.json()
    assert raw["object"] == "list" and raw["has_more"] is True and raw["first_id"] == raw["last_id"]


def test_a_second_edge_serves_the_same_files_and_sees_a_deletion(setup: dict, client: OpenAI) -> None:
    created = client.files.create(file=("shared.txt", b"shared bytes"), purpose="assistants")
    options = _options(setup["kafka"], setup["prefix"], setup["keys_file"], setup["blobs"])
    with serve_in_thread(options) as second:
        other_edge = _client(second, setup["key"])
        assert other_edge.files.retrieve(created.id) == created
        assert other_edge.files.content(created.id).read() == b"shared bytes"
        client.files.delete(created.id)
        deadline = time.monotonic() + 10
        while created.id in [f.id for f in other_edge.files.list()]:
            assert time.monotonic() < deadline, "the second edge still lists a deleted file"
            time.sleep(0.2)


def test_a_file_uploaded_on_one_edge_is_found_at_once_by_another_and_an_unknown_id_is_still_404(
        setup: dict, client: OpenAI) -> None:
    # Two edges behind one load balancer: the client takes the id it just got from one straight to the other, whose
    # files table has not polled the record yet. The other edge catches up on the miss instead of answering 404.
    options = _options(setup["kafka"], setup["prefix"], setup["keys_file"], setup["blobs"])
    with serve_in_thread(options) as second:
        other_edge = _client(second, setup["key"])
        for n in range(5):
            created = client.files.create(file=(f"rw-{n}.txt", b"read your writes"), purpose="assistants")
            assert other_edge.files.retrieve(created.id) == created
        for_store = client.files.create(file=("store.txt", b"for a vector store"), purpose="assistants")
        store = other_edge.vector_stores.create(name="read-your-writes")
        added = other_edge.vector_stores.files.create(vector_store_id=store.id, file_id=for_store.id)
        assert added.id == for_store.id
        started = time.monotonic()
        with pytest.raises(openai.NotFoundError):
            other_edge.files.retrieve("file-neveruploaded0000000000")
        assert time.monotonic() - started < FIND_CATCH_UP_S


def test_a_file_over_the_limit_is_413_naming_it_and_leaves_nothing(setup: dict, client: OpenAI) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        client.files.create(file=("big.bin", b"x" * (MAX_BYTES + 1)), purpose="assistants")
    assert caught.value.status_code == 413
    assert str(MAX_BYTES) in caught.value.message and "files.max_bytes" in caught.value.message
    assert not [p for p in setup["blobs"].rglob("*") if p.is_file() and "big" in p.name]
    assert not list(setup["blobs"].rglob("*.part"))


def test_a_bad_purpose_is_400_naming_purpose(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.files.create(file=("a.txt", b"a"), purpose="homework")  # type: ignore[arg-type]
    assert caught.value.param == "purpose" and "homework" in caught.value.message


def test_unknown_and_other_tenants_files_are_404_in_openais_shape(setup: dict, client: OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.files.retrieve("file-doesnotexist")
    assert caught.value.body["message"] == "No such File object: file-doesnotexist"
    assert caught.value.param == "id" and caught.value.type == "invalid_request_error"
    mine = client.files.create(file=("mine.txt", b"mine"), purpose="assistants")
    stranger = _client(setup["edge"], setup["other"])
    for call in (stranger.files.retrieve, stranger.files.content, stranger.files.delete):
        with pytest.raises(openai.NotFoundError):
            call(mine.id)
    assert mine.id not in [f.id for f in stranger.files.list()]


def test_a_purpose_validator_refuses_a_file_with_its_message_and_nothing_is_kept(client: OpenAI) -> None:
    def check(path: Path, filename: str) -> None:
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if not line.startswith("{"):
                raise InvalidFile(f"line {number} of {filename} is not a JSON object")

    register_validator("batch", check)
    try:
        with pytest.raises(openai.BadRequestError) as caught:
            client.files.create(file=("in.jsonl", b'{"a": 1}\nnot json\n'), purpose="batch")
        assert caught.value.body["message"] == "line 2 of in.jsonl is not a JSON object"
        assert caught.value.param == "file"
        assert not [f for f in client.files.list(purpose="batch") if f.filename == "in.jsonl"]
        assert client.files.create(file=("ok.jsonl", b'{"a": 1}\n'), purpose="batch").purpose == "batch"
    finally:
        unregister_validator("batch")


def test_bytes_changed_on_disk_are_refused_not_served(setup: dict, client: OpenAI) -> None:
    created = client.files.create(file=("kept.txt", b"original"), purpose="assistants")
    blob = next(p for p in setup["blobs"].rglob(created.id))
    blob.write_bytes(b"tampered")
    with pytest.raises(openai.InternalServerError) as caught:
        client.files.content(created.id)
    assert "SHA-256" in caught.value.message
