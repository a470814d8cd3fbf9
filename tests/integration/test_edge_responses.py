"""The Responses API (`/v1/responses`) through the official `openai` client, on the real worker, model and Kafka.

`client.responses.create` answers in OpenAI's shapes (checked by the client's own typed models), streamed with
OpenAI's event sequence and numbered events ending in the same object a non-streamed request gets; a function tool
round trip continues with `previous_response_id`; stored responses are read back and deleted (by their own tenant
only, and from a second edge replica, since storage is the topic); `store: false` keeps nothing; a field the server
cannot honour is a 400 naming it; and the websocket carries a `response.create` frame.
"""
from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import OpenAI
from openai.types.responses import Response

from streams.edge.keys import create_key
from streams.edge.server import serve_in_thread
from streams.testing.stack import DEFAULT_MODEL as MODEL
from streams.testing.stack import Stack
from tests.edge_support import edge_options, shared_worker, wait_ready
from tests.kafka_fixtures import kafka_bootstrap, kafka_single  # noqa: F401  (pytest fixtures)

pytestmark = [pytest.mark.kafka, pytest.mark.model, pytest.mark.timeout(600)]

WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a city.", "strict": True,
                "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}},
                               "required": ["city"], "additionalProperties": False}}


@pytest.fixture(scope="session")
def edge_worker(kafka_bootstrap: str) -> Iterator[Stack]:  # noqa: F811
    yield from shared_worker(kafka_bootstrap)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    keys_file = tmp_path_factory.mktemp("keys") / "keys.json"
    mine, _ = create_key(keys_file, "responses-a")
    theirs, _ = create_key(keys_file, "responses-b")
    return keys_file, mine, theirs


@pytest.fixture(scope="module")
def edges(kafka_bootstrap: str, edge_worker: Stack, keys: tuple[Path, str, str]) -> Iterator[tuple[str, str]]:  # noqa: F811
    """Two edge replicas on the same bus: their base URLs."""
    keys_file = keys[0]
    tag = uuid.uuid4().hex[:6]
    first = edge_options(kafka_bootstrap, edge_worker.topic_prefix, f"resp-{tag}-a", keys_file)
    second = edge_options(kafka_bootstrap, edge_worker.topic_prefix, f"resp-{tag}-b", keys_file)
    with serve_in_thread(first) as a, serve_in_thread(second) as b:
        wait_ready(a.base_url, edge_worker)
        wait_ready(b.base_url, edge_worker)
        yield a.base_url, b.base_url


def _client(base_url: str, key: str) -> OpenAI:
    return OpenAI(base_url=base_url + "/v1", api_key=key, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def client(edges: tuple[str, str], keys: tuple[Path, str, str]) -> OpenAI:
    return _client(edges[0], keys[1])


def test_a_text_input_gets_a_completed_response_in_openais_shape(client: OpenAI) -> None:
    response = client.responses.create(model=MODEL, input="Say hello.", instructions="Answer in one short sentence.",
                                       max_output_tokens=24, metadata={"case": "text"})
    assert isinstance(response, Response) and response.id.startswith("resp_") and response.object == "response"
    assert response.status in ("completed", "incomplete") and response.metadata == {"case": "text"}
    [message] = response.output
    assert message.type == "message" and message.role == "assistant" and message.content[0].type == "output_text"
    assert response.output_text == message.content[0].text and response.output_text
    usage = response.usage
    assert usage is not None and usage.input_tokens > 0 and 0 < usage.output_tokens <= 24
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens == 0 and usage.output_tokens_details.reasoning_tokens == 0


def test_the_stream_sends_openais_event_sequence_and_ends_with_the_same_object(client: OpenAI) -> None:
    kwargs: dict[str, Any] = {"model": MODEL, "input": "Count from one to five.", "max_output_tokens": 16,
                              "temperature": 0}
    whole = client.responses.create(**kwargs)
    events = list(client.responses.create(stream=True, **kwargs))
    kinds = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert kinds[:5] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added", "response.output_text.delta"]
    # 16 tokens of counting to five: cut off by max_output_tokens, so `response.incomplete` with its reason
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    final = events[-1].response
    assert final.status == "incomplete" and final.incomplete_details.reason == "max_output_tokens"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text == whole.output_text  # greedy: the same text, streamed or not
    assert final.output[0].status == "incomplete"


def test_a_function_tool_round_trip_continues_with_previous_response_id(client: OpenAI) -> None:
    first = client.responses.create(model=MODEL, input="What's the weather in Paris?", tools=[WEATHER_TOOL],
                                    tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=48)
    [call] = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id.startswith("call_") and call.status == "completed"
    assert isinstance(json.loads(call.arguments)["city"], str)
    second = client.responses.create(
        model=MODEL, previous_response_id=first.id, max_output_tokens=32, tools=[WEATHER_TOOL],
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": '{"temperature_c": 21}'}])
    assert second.previous_response_id == first.id and second.output
    # The same tools, the earlier input, its call and the result were all given to the model.
    assert second.usage.input_tokens > first.usage.input_tokens + len(call.arguments) // 4


def test_streamed_function_calls_send_argument_events(client: OpenAI) -> None:
    events = list(client.responses.create(model=MODEL, input="Weather in Oslo?", tools=[WEATHER_TOOL],
                                          tool_choice="required", parallel_tool_calls=False, max_output_tokens=48,
                                          stream=True))
    kinds = [e.type for e in events]
    added = next(e for e in events if e.type == "response.output_item.added")
    assert added.item.type == "function_call" and added.item.arguments == ""
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert kinds.index("response.function_call_arguments.delta") < kinds.index(
        "response.function_call_arguments.done") < kinds.index("response.completed")
    assert json.loads(done.arguments) == json.loads(events[-1].response.output[0].arguments)


def test_a_stored_response_is_read_on_another_replica_only_by_its_tenant_then_deleted(
        client: OpenAI, edges: tuple[str, str], keys: tuple[Path, str, str]) -> None:
    created = client.responses.create(model=MODEL, input="Name a colour.", max_output_tokens=16)
    other_replica = _client(edges[1], keys[1])
    assert other_replica.responses.retrieve(created.id).model_dump() == created.model_dump()
    with pytest.raises(openai.NotFoundError):
        _client(edges[0], keys[2]).responses.retrieve(created.id)  # another tenant: as if it did not exist
    with pytest.raises(openai.NotFoundError):
        _client(edges[0], keys[2]).responses.delete(created.id)
    other_replica.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(created.id)


def test_store_false_keeps_nothing(client: OpenAI) -> None:
    response = client.responses.create(model=MODEL, input="Say yes.", max_output_tokens=16, store=False)
    assert response.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=MODEL, input="And?", previous_response_id=response.id, max_output_tokens=16)
    error = refused.value.body
    assert error["param"] == "previous_response_id" and error["code"] == "previous_response_not_found"


@pytest.mark.parametrize(("fields", "param", "code"), [
    ({"max_tokens": 16}, "max_tokens", "unknown_parameter"),
    ({"reasoning": {"effort": "high"}}, "reasoning", "unsupported_parameter"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
     "input[0].content[0].type", "unsupported_value"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "bogus"}}}},
     "text.format.schema", "invalid_schema"),
    ({"max_output_tokens": 4}, "max_output_tokens", "invalid_value"),
])
def test_a_field_the_server_cannot_honour_is_a_400_naming_it(client: OpenAI, fields: dict[str, Any], param: str,
                                                             code: str) -> None:
    body = {"input": "hi", **fields}
    with pytest.raises(openai.BadRequestError) as refused:
        client.post("/responses", body={"model": MODEL, **body}, cast_to=Response)
    assert refused.value.status_code == 400
    assert refused.value.body["param"] == param and refused.value.body["code"] == code


def test_text_format_json_schema_gives_json_that_follows_it(client: OpenAI) -> None:
    schema = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}},
              "required": ["colour"], "additionalProperties": False}
    response = client.responses.create(model=MODEL, input="Pick a colour.", max_output_tokens=32, text={
        "format": {"type": "json_schema", "name": "pick", "schema": schema, "strict": True}})
    assert json.loads(response.output_text)["colour"] in ("red", "green", "blue")


def test_the_websocket_carries_a_response_create_frame(edges: tuple[str, str], keys: tuple[Path, str, str]) -> None:
    import asyncio

    import websockets

    async def run() -> list[dict[str, Any]]:
        url = edges[0].replace("http://", "ws://") + "/v1/ws"
        async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {keys[1]}"}) as ws:
            await ws.send(json.dumps({"type": "response.create", "id": 7, "model": MODEL, "input": "Say hi.",
                                      "max_output_tokens": 16}))
            frames = []
            async for frame in ws:
                frames.append(json.loads(frame))
                if frames[-1]["type"] in ("response.completed", "response.incomplete", "error"):
                    break
            # A field the Responses API does not have is refused by name, and the socket stays open.
            await ws.send(json.dumps({"type": "response.create", "id": 8, "model": MODEL, "input": "x",
                                      "max_tokens": 5}))
            refused = json.loads(await ws.recv())
            assert (refused["type"], refused["id"], refused["param"], refused["status"]) == ("error", 8, "max_tokens",
                                                                                            400)
        return frames

    frames = asyncio.run(run())
    assert {f["id"] for f in frames} == {7}
    assert frames[0]["type"] == "response.created" and frames[-1]["type"] in ("response.completed",
                                                                                "response.incomplete")
    final = Response.model_validate(frames[-1]["response"])
    assert final.output_text == "".join(f["delta"] for f in frames if f["type"] == "response.output_text.delta")
    with OpenAI(base_url=edges[1] + "/v1", api_key=keys[1], max_retries=0) as other:
        assert other.responses.retrieve(final.id).output_text == final.output_text
