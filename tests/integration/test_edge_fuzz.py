"""Property-based fuzz of the edge's HTTP API from its own OpenAPI document (schemathesis).

For every operation in ``/openapi.json`` schemathesis generates valid and
invalid requests from the schema and checks the responses: never a 5xx, the
status codes, content types, headers and bodies the document declares, valid
data accepted and invalid data refused, and auth not ignored. Each call has a
timeout, so a hang fails the test.

The edge is the real one with auth on, on the real Kafka; the worker behind it
is the fast test double of tests/unit/test_edge_routing.py (a few tokens per
request, instantly), because the fuzzer sends hundreds of valid generation
requests and the real model would take minutes for them. The examples per
operation are bounded so the module runs in well under a minute.
"""
from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, assume, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import positive_data_acceptance

from schemas.topics import TopicCatalog
from streams.edge.keys import create_key
from streams.edge.server import RunningEdge, serve_in_thread
from tests.edge_support import edge_options
from tests.kafka_fixtures import kafka_bootstrap, kafka_single  # noqa: F401  (pytest fixtures)
from tests.integration.test_edge_routing import FakeWorker, LoopThread

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300),
              pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")]

MAX_EXAMPLES = 40
CALL_TIMEOUT_S = 20


@pytest.fixture(scope="module")
def fuzz_target(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningEdge, str]]:  # noqa: F811
    prefix = f"t-edge-fuzz-{uuid.uuid4().hex[:8]}"
    keys_file: Path = tmp_path_factory.mktemp("keys") / "keys.json"
    key, _ = create_key(keys_file, "fuzzer", rpm=0, tpm=0, concurrency=0)
    loop = LoopThread()
    worker = FakeWorker(kafka_bootstrap, TopicCatalog(prefix=prefix))
    loop.call(worker.start())
    try:
        options = edge_options(kafka_bootstrap, prefix, f"{prefix}-edge", keys_file, request_timeout_s=15.0,
                               max_body_bytes=256 * 1024)
        with serve_in_thread(options) as edge:
            heartbeat = loop.call(_start_heartbeat(worker))
            yield edge, key
            heartbeat.cancel()
    finally:
        loop.call(worker.stop())
        loop.close()


async def _start_heartbeat(worker: FakeWorker) -> asyncio.Task:
    """Announce the double every half second, so /readyz says ready as with a real worker."""
    async def beat() -> None:
        while True:
            await worker.announce()
            await asyncio.sleep(0.5)

    return asyncio.create_task(beat())


STORE = "/v1/vector_stores/{store_id}"
# A generated id names nothing: 404 is the right answer to a well-formed one (a batch's input file included).
FILE_BY_ID = ["GET /v1/files/{file_id}", "DELETE /v1/files/{file_id}", "GET /v1/files/{file_id}/content",
              f"GET {STORE}", f"DELETE {STORE}", f"POST {STORE}/files", f"GET {STORE}/files",
              f"GET {STORE}/files/{{file_id}}", f"DELETE {STORE}/files/{{file_id}}", f"POST {STORE}/file_batches",
              f"GET {STORE}/file_batches/{{batch_id}}", f"POST {STORE}/search",
              "POST /v1/batches", "GET /v1/batches/{batch_id}", "POST /v1/batches/{batch_id}/cancel",
              "GET /v1/responses/{response_id}", "DELETE /v1/responses/{response_id}"]
OPERATIONS = ["GET /healthz", "GET /readyz", "GET /v1/models", "GET /v1/models/{model}",
              "POST /v1/chat/completions", "POST /v1/completions", "POST /v1/responses", "POST /v1/files",
              "GET /v1/files", "POST /v1/vector_stores", "GET /v1/vector_stores", "GET /v1/batches", *FILE_BY_ID]
# Operations with no parameter or body have no invalid input to generate.
WITH_INPUT = ["GET /v1/models/{model}", "POST /v1/chat/completions", "POST /v1/completions", "POST /v1/responses",
              "POST /v1/files",
              "GET /v1/files", "GET /v1/vector_stores", "GET /v1/batches", *FILE_BY_ID]
CASES = [(label, GenerationMode.POSITIVE) for label in OPERATIONS] + [(label, GenerationMode.NEGATIVE) for label in WITH_INPUT]


@pytest.fixture(scope="module")
def api_schema(fuzz_target: tuple[RunningEdge, str]):
    edge, _ = fuzz_target
    return schemathesis.openapi.from_url(edge.base_url + "/openapi.json")


def test_the_document_lists_every_http_operation(api_schema) -> None:
    labels = sorted(result.ok().label for result in api_schema.get_all_operations())
    assert labels == sorted(OPERATIONS)


# schemathesis' own pytest plugin does not run under this pytest; hypothesis drives each operation directly.
@pytest.mark.parametrize(("label", "mode"), CASES, ids=[f"{label}-{mode.value}" for label, mode in CASES])
def test_api_conforms_to_its_openapi_document(api_schema, fuzz_target: tuple[RunningEdge, str], label: str,
                                              mode: GenerationMode) -> None:
    _, key = fuzz_target
    operation = api_schema.find_operation_by_label(label)

    statuses: list[int] = []
    # Whether a prompt plus max_tokens fits the context depends on the prompt's tokens, which no JSON Schema can
    # say: a schema-valid generation request may still get 400 context_length_exceeded (documented as such).
    # A generated file id names no file: 404 is the right answer to a well-formed one.
    excluded = [positive_data_acceptance] if label.startswith("POST") or label in FILE_BY_ID else []

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def run(case) -> None:
        # A query parameter without a name ("?after=&=null") never reaches the edge (the query string's parser drops
        # a nameless pair), so the request that arrives is valid: not negative data the edge could refuse.
        assume("" not in (case.query or {}))
        headers = dict(case.headers or {})
        headers["Authorization"] = f"Bearer {key}"  # the generated one is a random token
        response = case.call_and_validate(headers=headers, timeout=CALL_TIMEOUT_S, excluded_checks=excluded)
        statuses.append(response.status_code)

    run()
    assert statuses and max(statuses) < 500
    if mode is GenerationMode.POSITIVE and label not in FILE_BY_ID:
        assert any(200 <= s < 300 for s in statuses), statuses  # valid input really was served, not only refused


def test_the_document_describes_bodies_error_shapes_sse_events_and_security(
        fuzz_target: tuple[RunningEdge, str]) -> None:
    """Bodies, responses with OpenAI's error shape, the SSE events and the security scheme are all described."""
    import httpx

    edge, _ = fuzz_target
    doc = httpx.get(edge.base_url + "/openapi.json", timeout=10).json()
    schemes = doc["components"]["securitySchemes"]
    assert schemes == {"ApiKey": {"type": "http", "scheme": "bearer", "bearerFormat": "sk-ss-...",
                                  "description": schemes["ApiKey"]["description"]}}
    error_ref = {"$ref": "#/components/schemas/ErrorResponse"}
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            public = not path.startswith("/v1/")
            assert ("security" in operation) != public, (method, path)
            if not public:
                assert operation["security"] == [{"ApiKey": []}]
                assert operation["responses"]["401"]["content"]["application/json"]["schema"] == error_ref
            assert operation.get("summary") or operation.get("description"), (method, path)
    for path, body in (("/v1/chat/completions", "ChatCompletionBody"), ("/v1/completions", "CompletionBody")):
        operation = doc["paths"][path]["post"]
        assert operation["requestBody"]["content"]["application/json"]["schema"] == {"$ref": f"#/components/schemas/{body}"}
        schema = doc["components"]["schemas"][body]
        assert schema["additionalProperties"] is False and "model" in schema["required"]
        assert schema["properties"]["model"]["enum"] == list(edge.options.models)
        for status in ("400", "401", "404", "413", "429", "503", "504"):
            assert operation["responses"][status]["content"]["application/json"]["schema"] == error_ref, status
        assert "Retry-After" in operation["responses"]["429"]["headers"]
        ok = operation["responses"]["200"]["content"]
        assert set(ok) == {"application/json", "text/event-stream"}
        assert ok["text/event-stream"]["schema"]["properties"]["data"]["anyOf"][0] == {"type": "string", "const": "[DONE]"}
    assert "/v1/ws" in doc["info"]["description"] and "1008" in doc["info"]["description"]
