"""The chat API's structured-output parameters at admission: what becomes the wire's tools and
constraint, and every misuse refused with a 400 naming the parameter."""
from __future__ import annotations

from typing import Any

import pytest

from streams.wire import errors
from streams.wire.bodies import ChatCompletionBody, WsRequestBody
from streams.wire.parse import parse_body
from streams.wire.structured import MAX_TOOLS

MODEL = "smollm2-135m-instruct"
USER = [{"role": "user", "content": "weather in Rome?"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def chat(**fields: Any) -> ChatCompletionBody:
    return parse_body(ChatCompletionBody, {"model": MODEL, "messages": USER, **fields})


def refusal(**fields: Any) -> errors.EdgeError:
    with pytest.raises(errors.EdgeError) as caught:
        chat(**fields).constraint()
    return caught.value


def test_tools_default_to_auto_with_parallel_calls() -> None:
    body = chat(tools=[WEATHER])
    assert [t.name for t in body.wire_tools() or []] == ["get_weather"]
    c = body.constraint()
    assert c is not None and (c.kind, c.tool_choice, c.parallel_tool_calls) == ("tool_calls", "auto", True)


def test_a_named_tool_choice_and_no_parallel_calls_travel_as_given() -> None:
    c = chat(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}},
             parallel_tool_calls=False).constraint()
    assert c is not None and (c.tool_choice, c.parallel_tool_calls) == ("get_weather", False)


def test_tool_choice_none_offers_no_tools_and_constrains_nothing() -> None:
    body = chat(tools=[WEATHER], tool_choice="none")
    assert body.wire_tools() is None and body.constraint() is None


def test_response_formats_become_json_constraints() -> None:
    assert chat(response_format={"type": "text"}).constraint() is None
    c = chat(response_format={"type": "json_object"}).constraint()
    assert c is not None and (c.kind, c.json_schema) == ("json", None)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    c = chat(response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema, "strict": True}}
             ).constraint()
    assert c is not None and c.json_schema == schema


def test_the_websocket_takes_the_same_parameters_but_tools_need_messages() -> None:
    body = parse_body(WsRequestBody, {"model": MODEL, "messages": USER, "tools": [WEATHER], "tool_choice": "required"})
    c = body.constraint()
    assert c is not None and c.tool_choice == "required"
    with pytest.raises(errors.EdgeError) as caught:
        parse_body(WsRequestBody, {"model": MODEL, "prompt": "hi", "tools": [WEATHER]})
    assert (caught.value.status, caught.value.param) == (400, "tools")


@pytest.mark.parametrize(("fields", "code", "param"), [
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "invalid_value",
     "tool_choice"),
    ({"tool_choice": "required"}, "invalid_value", "tool_choice"),
    ({"tools": [WEATHER, WEATHER]}, "invalid_value", "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]}, "invalid_schema",
     "tools[0].function.parameters"),
    ({"tools": [WEATHER, {"type": "function", "function": {"name": "g", "parameters": {
        "type": "string", "format": "no-such-format"}}}]}, "invalid_schema", "tools[1].function.parameters"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}}},
     "invalid_schema", "response_format.json_schema.schema"),
    ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "unsupported_value", "response_format"),
])
def test_misuse_is_a_400_naming_the_parameter(fields: dict[str, Any], code: str, param: str) -> None:
    error = refusal(**fields)
    assert (error.status, error.code, error.param) == (400, code, param)


@pytest.mark.parametrize(("fields", "param"), [
    ({"tools": [dict(WEATHER, function={"name": f"f{i}"}) for i in range(MAX_TOOLS + 1)]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    # Found by the fuzz test: an earlier assistant call without a function name was a 500, not a 400.
    ({"messages": USER + [{"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "", "arguments": "{}"}}]}]},
     "messages[1].tool_calls[0].function.name"),
])
def test_malformed_structured_parameters_are_named(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(errors.EdgeError) as caught:
        chat(**fields)
    assert (caught.value.status, caught.value.param) == (400, param)


def test_conversations_carry_tool_calls_and_tool_results() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}
    body = chat(tools=[WEATHER], messages=USER + [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ])
    messages = body.chat_input() or []
    assert messages[1].tool_calls and messages[1].tool_calls[0].name == "get_weather"
    assert messages[2].tool_call_id == "call_1"
    with pytest.raises(errors.EdgeError) as caught:
        chat(messages=USER + [{"role": "tool", "content": "sunny"}])
    assert caught.value.param is not None and caught.value.param.startswith("messages[1]")


def test_the_openapi_document_keeps_request_messages_apart_from_response_messages() -> None:
    from fastapi import FastAPI

    from streams.edge import openapi
    from streams.edge.openai_api import router

    app = FastAPI()
    app.include_router(router)
    openapi.install(app, (MODEL,))
    schemas = app.openapi()["components"]["schemas"]
    assert "tool_call_id" in schemas["ToolMessageParam"]["required"]
    assert "name" in schemas["AssistantMessageParam"]["properties"]  # the request's, not the response's
    assert set(schemas["AssistantMessage"]["properties"]) == {"role", "content", "tool_calls"}
    assert "tool_calls" in schemas["ChatDelta"]["properties"]
