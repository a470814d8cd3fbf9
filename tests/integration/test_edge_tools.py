"""Tool calling and structured output through the official `openai` client, on the real worker and Kafka.

Whatever the prompt and schema (enums, required fields, integer ranges, nested objects, arrays),
`tool_choice="required"` or a named function gives calls whose arguments parse and validate,
streamed (OpenAI's tool_calls deltas) and not; `response_format` json_schema gives JSON that
validates; and speculation on or off gives the same output, token for token. With the client's defaults
(`parallel_tool_calls` unset) a named function is called exactly once; a call cut off by max_tokens is
`content` with finish_reason `length`, never a call, on HTTP and the websocket; and 18 held-out prompts give
well-formed answers, no tag text anywhere.
"""
from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest
from openai import OpenAI

from engine.grammar.constraint import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from streams.testing.stack import DEFAULT_MODEL as MODEL
from streams.testing.stack import Stack
from tests.edge_support import keyed_edge, shared_worker
from tests.kafka_fixtures import kafka_bootstrap, kafka_single  # noqa: F401  (pytest fixtures)

pytestmark = [pytest.mark.kafka, pytest.mark.model, pytest.mark.timeout(600)]

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 16},
    "unit": {"enum": ["celsius", "fahrenheit"]},
}, "required": ["city", "unit"], "additionalProperties": False}
BOOKING = {"type": "object", "properties": {
    "guests": {"type": "integer", "minimum": 1, "maximum": 8},
    "stay": {"type": "object", "properties": {"nights": {"type": "integer", "minimum": 1, "maximum": 14},
                                              "breakfast": {"type": "boolean"}},
             "required": ["nights", "breakfast"], "additionalProperties": False},
}, "required": ["guests", "stay"], "additionalProperties": False}
SHOPPING = {"type": "object", "properties": {
    "items": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 1, "maxItems": 3},
}, "required": ["items"], "additionalProperties": False}
SCHEMAS = {"get_weather": WEATHER, "book_hotel": BOOKING, "add_to_list": SHOPPING}
TOOLS = [{"type": "function", "function": {"name": name, "description": f"{name.replace('_', ' ')}",
                                            "parameters": schema}} for name, schema in SCHEMAS.items()]
PROMPTS = ["What's the weather in Paris?", "Book a hotel for two people for three nights with breakfast.",
           "Add milk and eggs to my shopping list."]


@pytest.fixture(scope="session")
def edge_worker(kafka_bootstrap: str) -> Iterator[Stack]:  # noqa: F811
    yield from shared_worker(kafka_bootstrap)


@pytest.fixture(scope="module")
def client(kafka_bootstrap: str, edge_worker: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenAI]:  # noqa: F811
    with keyed_edge(kafka_bootstrap, edge_worker, tmp_path_factory.mktemp("keys"), "tools-tests", "tools") as (url, key):
        yield OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=300)


def ask(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


def assert_valid_calls(calls: list[Any], names: set[str]) -> list[tuple[str, Any]]:
    assert calls, "no tool call"
    out = []
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_") and call.function.name in names
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, SCHEMAS[call.function.name])
        out.append((call.function.name, arguments))
    return out


def streamed_calls(client: OpenAI, **kwargs: Any) -> tuple[list[dict[str, Any]], str | None, str]:
    """Reassemble streamed tool_calls deltas exactly as OpenAI's docs say: by index, the first one with
    id and name, then argument fragments."""
    calls: dict[int, dict[str, Any]] = {}
    content, finish = "", None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for delta in choice.delta.tool_calls or []:
            if delta.id is not None:
                assert delta.index not in calls and delta.function.arguments == ""
                calls[delta.index] = {"id": delta.id, "name": delta.function.name, "arguments": ""}
            else:
                assert delta.function.name is None
                calls[delta.index]["arguments"] += delta.function.arguments
        finish = choice.finish_reason or finish
    return [calls[i] for i in sorted(calls)], finish, content


@pytest.mark.parametrize("prompt", PROMPTS)
def test_required_tool_choice_always_gives_calls_that_validate(client: OpenAI, prompt: str) -> None:
    # One call at most: the test worker's context (512 tokens) leaves little room after the tool listing.
    response = client.chat.completions.create(model=MODEL, messages=ask(prompt), tools=TOOLS, tool_choice="required",
                                              parallel_tool_calls=False, max_tokens=64)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert len(assert_valid_calls(choice.message.tool_calls or [], set(SCHEMAS))) == 1  # parallel_tool_calls false


@pytest.mark.parametrize(("prompt", "name"), list(zip(PROMPTS, SCHEMAS)))
def test_a_named_function_is_called_exactly_once_streamed_or_not(client: OpenAI, prompt: str, name: str) -> None:
    # parallel_tool_calls unset (the client's default): a named function is still called once, then the answer ends.
    choice = {"type": "function", "function": {"name": name}}
    kwargs = dict(model=MODEL, messages=ask(prompt), tools=TOOLS, tool_choice=choice, max_tokens=64,
                  temperature=0.8, seed=5)
    whole = client.chat.completions.create(**kwargs).choices[0]
    assert whole.finish_reason == "tool_calls"
    calls = assert_valid_calls(whole.message.tool_calls or [], {name})
    assert len(calls) == 1
    streamed, finish, content = streamed_calls(client, **kwargs)
    assert finish == "tool_calls" and content == ""
    assert [(c["name"], json.loads(c["arguments"])) for c in streamed] == calls


def test_required_with_parallel_calls_allowed_streams_the_same_whole_calls(client: OpenAI) -> None:
    kwargs = dict(model=MODEL, messages=ask(PROMPTS[2]), tools=TOOLS, tool_choice="required", max_tokens=80)
    whole = client.chat.completions.create(**kwargs).choices[0]
    calls = assert_valid_calls(whole.message.tool_calls or [], set(SCHEMAS))
    assert not tag_text(whole.message.content or "")
    streamed, finish, content = streamed_calls(client, **kwargs)
    assert (finish, content) == (whole.finish_reason, whole.message.content or "")
    assert [(c["name"], json.loads(c["arguments"])) for c in streamed] == calls


def test_a_call_cut_off_by_max_tokens_is_content_with_finish_reason_length_streamed_or_not(client: OpenAI) -> None:
    kwargs = dict(model=MODEL, messages=ask(PROMPTS[1]), tools=TOOLS, max_tokens=24,
                  tool_choice={"type": "function", "function": {"name": "book_hotel"}})
    whole = client.chat.completions.create(**kwargs).choices[0]
    assert whole.finish_reason == "length" and not whole.message.tool_calls
    # The partial call, without its tag: where OpenAI puts output cut off by max_tokens.
    assert (whole.message.content or "").startswith('{"name": "book_hotel", "arguments": {')
    assert not tag_text(whole.message.content or "")
    streamed, finish, content = streamed_calls(client, **kwargs)
    assert (streamed, finish, content) == ([], "length", whole.message.content)


@pytest.mark.parametrize("schema", [WEATHER, BOOKING, SHOPPING])
def test_response_format_json_schema_gives_json_that_validates(client: OpenAI, schema: dict[str, Any]) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}
    kwargs = dict(model=MODEL, messages=ask("Answer in JSON: " + PROMPTS[0]), response_format=fmt, max_tokens=64)
    whole = client.chat.completions.create(**kwargs).choices[0]
    assert whole.finish_reason == "stop"
    jsonschema.validate(json.loads(whole.message.content or ""), schema)
    text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kwargs)
                   if c.choices)
    assert text == whole.message.content


def test_json_object_gives_a_json_object(client: OpenAI) -> None:
    response = client.chat.completions.create(model=MODEL, messages=ask("Describe Kafka as a JSON object."),
                                              response_format={"type": "json_object"}, max_tokens=160)
    if response.choices[0].finish_reason == "stop":  # a free-form object may outgrow max_tokens
        assert isinstance(json.loads(response.choices[0].message.content or ""), dict)
    else:
        assert (response.choices[0].message.content or "").startswith("{")


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.9, "seed": 21}])
def test_constrained_output_is_the_same_with_speculation_on_and_off(client: OpenAI, sampling: dict[str, Any]) -> None:
    def run(speculation: bool) -> tuple[Any, str | None]:
        tools = client.chat.completions.create(model=MODEL, messages=ask(PROMPTS[1]), tools=TOOLS,
                                               tool_choice="required", parallel_tool_calls=False, max_tokens=64,
                                               extra_body={"speculation": speculation}, **sampling)
        fmt = {"type": "json_schema", "json_schema": {"name": "b", "schema": BOOKING}}
        json_answer = client.chat.completions.create(model=MODEL, messages=ask(PROMPTS[1]), response_format=fmt,
                                                     max_tokens=64, extra_body={"speculation": speculation},
                                                     **sampling)
        calls = [(c.function.name, c.function.arguments) for c in tools.choices[0].message.tool_calls or []]
        return calls, json_answer.choices[0].message.content

    assert run(True) == run(False)


def test_auto_lets_the_model_answer_in_text_and_a_tool_result_continues_the_conversation(client: OpenAI) -> None:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}
    messages = ask(PROMPTS[0]) + [{"role": "assistant", "content": None, "tool_calls": [call]},
                                  {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"}]
    response = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=24)
    choice = response.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    if choice.message.tool_calls:
        assert_valid_calls(choice.message.tool_calls, set(SCHEMAS))
    else:
        assert choice.message.content and "<tool_call>" not in choice.message.content


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "fly"}}}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                              "properties": {"a": {"type": 3}}}}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(65)]}, "tools"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
     "response_format.json_schema.schema"),
])
def test_bad_structured_parameters_are_400s_naming_the_parameter(client: OpenAI, kwargs: dict[str, Any],
                                                                  param: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=ask("hi"), max_tokens=4, **kwargs)
    assert caught.value.param == param


def ws_answer(ws: Any, frame: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The done frame of one request on the socket, and every delta its chunk and done frames carried."""
    ws.send(json.dumps(frame))
    deltas: list[dict[str, Any]] = []
    while True:
        event = json.loads(ws.recv(timeout=300))
        assert event["type"] in ("chunk", "done") and event["id"] == frame["id"], event
        deltas += event.get("deltas", [])
        if event["type"] == "done":
            return event, deltas


def test_the_websocket_carries_the_same_tool_calls_and_deltas(client: OpenAI) -> None:
    from websockets.sync.client import connect

    url = str(client.base_url).replace("http", "ws", 1).rstrip("/") + "/ws"
    named = {"model": MODEL, "messages": ask(PROMPTS[0]), "tools": TOOLS,
             "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    with connect(url, additional_headers={"Authorization": f"Bearer {client.api_key}"}) as ws:
        event, deltas = ws_answer(ws, {"id": 7, **named, "max_tokens": 64})
        cut, cut_deltas = ws_answer(ws, {"id": 8, **named, "max_tokens": 20})
    assert event["finish_reason"] == "tool_calls" and event["content"] is None
    [call] = event["tool_calls"]
    assert call["function"]["name"] == "get_weather" and call["id"].startswith("call_")
    jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER)
    fragments = [d["tool_calls"][0] for d in deltas]
    assert fragments[0]["id"] == call["id"]
    assert "".join(f["function"]["arguments"] for f in fragments) == call["function"]["arguments"]
    # Cut off by max_tokens: no call, the partial text as content, without its tag.
    assert (cut["finish_reason"], cut["tool_calls"]) == ("length", [])
    assert cut["content"].startswith('{"name": "get_weather"') and not tag_text(cut["content"])
    assert "".join(d["content"] for d in cut_deltas) == cut["content"]


# Held-out prompts, sent with the client's defaults (parallel_tool_calls unset) and each kind of tool_choice.
NAMED = [("Is it raining in Oslo right now?", "get_weather"), ("How cold is Montreal today in fahrenheit?", "get_weather"),
         ("I need a room for one guest for a week, no breakfast.", "book_hotel"),
         ("Reserve a hotel: 4 people, 2 nights, breakfast included.", "book_hotel"),
         ("Put bread on the grocery list.", "add_to_list"), ("Remember to buy apples, rice and tea.", "add_to_list")]
REQUIRED = ["Weather forecast for Lima, please.", "Book me a hotel for five guests for ten nights.",
            "Add butter to my list.", "Should I take an umbrella in London?", "We are 3, staying 4 nights, with breakfast.",
            "Shopping list: cheese and tomatoes."]
AUTO = ["What's the weather in Berlin in celsius?", "Please book a hotel for 2 guests for 1 night.",
        "Add coffee to my shopping list.", "Hello! How are you?", "Is it hot in Cairo?", "Add soap and salt to my list."]
HELD_OUT: list[tuple[str, Any]] = ([(p, {"type": "function", "function": {"name": n}}) for p, n in NAMED]
                                   + [(p, "required") for p in REQUIRED] + [(p, "auto") for p in AUTO])


def tag_text(text: str) -> bool:
    """Whether text holds a tool-call tag, whole or as its cut-off start at the end (a lone '<')."""
    text = text.rstrip()
    return any(tag in text or any(text.endswith(tag[:n]) for n in range(1, len(tag)))
               for tag in (TOOL_CALL_OPEN, TOOL_CALL_CLOSE))


def malformed(choice: Any, tool_choice: Any) -> str | None:
    """Why an answer is not a well-formed call (valid JSON arguments against the schema) or plain content."""
    content, calls = choice.message.content or "", choice.message.tool_calls or []
    if tag_text(content):
        return f"tag text in content {content!r}"
    for call in calls:
        if tag_text(call.function.arguments):
            return f"tag text in arguments {call.function.arguments!r}"
        try:
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
        except (ValueError, jsonschema.ValidationError) as error:
            return f"arguments {call.function.arguments!r}: {error}"
    if isinstance(tool_choice, dict) and [c.function.name for c in calls] != [tool_choice["function"]["name"]]:
        return f"named tool_choice gave {[c.function.name for c in calls]}"
    if tool_choice == "required" and not calls:
        return "required gave no call"
    if choice.finish_reason not in (("tool_calls", "length") if calls else ("stop", "length")):
        return f"finish_reason {choice.finish_reason} with {len(calls)} calls"
    return None


def test_held_out_tool_prompts_with_the_clients_defaults_all_give_well_formed_answers(client: OpenAI) -> None:
    failures, ends = [], Counter()
    for prompt, tool_choice in HELD_OUT:  # no max_tokens either: the edge's default, what the context leaves
        choice = client.chat.completions.create(model=MODEL, messages=ask(prompt), tools=TOOLS,
                                                tool_choice=tool_choice).choices[0]
        ends[f"{choice.finish_reason} with {len(choice.message.tool_calls or [])} calls"] += 1
        why = malformed(choice, tool_choice)
        if why is not None:
            failures.append(f"{prompt!r} ({tool_choice}): {why}")
    print(f"held-out tool calls: {len(HELD_OUT) - len(failures)}/{len(HELD_OUT)} well formed; {dict(ends)}")
    assert not failures, "\n".join(failures)
