"""The OpenAPI document is the code: every JSON answer of a /v1 route is a typed model of the OpenAI wire contract
(streams/wire), named in the document as a $ref to its component, never an untyped object."""
from __future__ import annotations

from typing import Any

import pytest

from streams.config import Settings
from streams.edge.app import create_app

# Routes whose success is not JSON, and why. (The LoRA routes, which answer plain text as vLLM's do, are not in the
# document at all: include_in_schema=False.)
NOT_JSON = {
    ("get", "/v1/files/{file_id}/content"): "a file download: the file's bytes, application/octet-stream",
}
# Routes that may also answer a stream (stream: true): their JSON answer is typed like any other, and their
# text/event-stream entry names the chunk components.
STREAMING = {("post", "/v1/chat/completions"), ("post", "/v1/completions"), ("post", "/v1/responses")}


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return create_app(Settings()).openapi()


def _operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(method, path, operation) for path, item in doc["paths"].items() if path.startswith("/v1/")
            for method, operation in item.items()]


def _success(operation: dict[str, Any]) -> dict[str, Any]:
    [status] = [s for s in operation["responses"] if s.startswith("2")]
    return operation["responses"][status].get("content", {})


def test_every_json_answer_under_v1_is_a_reference_to_a_component(doc: dict[str, Any]) -> None:
    untyped = {}
    for method, path, operation in _operations(doc):
        if (method, path) in NOT_JSON:
            continue
        schema = _success(operation).get("application/json", {}).get("schema", {})
        ref = schema.get("$ref", "")
        name = ref.removeprefix("#/components/schemas/")
        if not ref.startswith("#/components/schemas/") or name not in doc["components"]["schemas"]:
            untyped[f"{method.upper()} {path}"] = schema
    assert not untyped, f"declare a response_model (a streams/wire model) for: {untyped}"


def test_the_exceptions_are_still_routes_that_answer_no_json(doc: dict[str, Any]) -> None:
    operations = {(method, path): operation for method, path, operation in _operations(doc)}
    for route in NOT_JSON:
        assert route in operations, f"{route} is gone: remove it from NOT_JSON"
        assert "application/json" not in _success(operations[route])


def test_streaming_routes_describe_their_events_next_to_their_json_answer(doc: dict[str, Any]) -> None:
    operations = {(method, path): operation for method, path, operation in _operations(doc)}
    for route in STREAMING:
        content = _success(operations[route])
        assert set(content) == {"application/json", "text/event-stream"}, route
        assert "$ref" in content["application/json"]["schema"], route
