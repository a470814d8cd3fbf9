"""How tools reach a model without a tool template (SmolLM2-135M): our Hermes-style system section,
earlier calls and tool results rendered the way the grammar writes them; and the request's
constraint compiled for the engine (a bad one is a rejection, never an exception)."""
from __future__ import annotations

from typing import Any

import pytest

from engine.request import RequestRejected
from schemas.events import ChatMessage, GenerateRequest, OutputConstraint, ReplyRoute, ToolCall, ToolSpec
from streams.wire.chat_template import template_messages
from streams.worker.intake import engine_constraint

WEATHER = ToolSpec(name="get_weather", description="Weather of a city",
                   parameters={"type": "object", "properties": {"city": {"type": "string"}}})


class NoToolTemplate:
    chat_template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


class ToolTemplate:
    chat_template = "{% if tools %}{{ tools }}{% endif %}"


def request(messages: list[ChatMessage], **fields: Any) -> GenerateRequest:
    return GenerateRequest(request_id="r", messages=messages, model="m", reply_to=ReplyRoute(topic="t"), **fields)


CONVERSATION = [
    ChatMessage(role="user", content="Weather in Rome?"),
    ChatMessage(role="assistant", content="", tool_calls=[ToolCall(id="c1", name="get_weather",
                                                                     arguments='{"city":"Rome"}')]),
    ChatMessage(role="tool", content="sunny", tool_call_id="c1"),
]


def test_tools_go_into_a_system_section_and_calls_are_rendered_as_the_grammar_writes_them() -> None:
    messages, kwargs = template_messages(request(CONVERSATION, tools=[WEATHER]), NoToolTemplate())
    assert kwargs == {}
    assert messages[0]["role"] == "system" and "<tools>" in messages[0]["content"]
    assert '{"type":"function","function":{"name":"get_weather"' in messages[0]["content"]
    assert messages[2]["content"] == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    assert messages[3] == {"role": "tool", "content": "<tool_response>\nsunny\n</tool_response>"}


def test_an_existing_system_message_gets_the_section_appended() -> None:
    messages, _ = template_messages(request([ChatMessage(role="system", content="Be brief."), *CONVERSATION[:1]],
                                            tools=[WEATHER]), NoToolTemplate())
    assert messages[0]["content"].startswith("Be brief.\n\n") and "<tools>" in messages[0]["content"]
    assert len(messages) == 2


def test_a_model_with_its_own_tool_template_gets_the_tools_and_openai_shaped_messages() -> None:
    messages, kwargs = template_messages(request(CONVERSATION, tools=[WEATHER]), ToolTemplate())
    assert kwargs["tools"][0] == {"type": "function", "function": WEATHER.model_dump(exclude_none=True)}
    assert messages[1]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": {"city": "Rome"}}
    assert messages[2]["tool_call_id"] == "c1"


def test_without_tools_plain_messages_are_unchanged_and_earlier_calls_still_rendered() -> None:
    messages, kwargs = template_messages(request(CONVERSATION[:1]), NoToolTemplate())
    assert (messages, kwargs) == ([{"role": "user", "content": "Weather in Rome?"}], {})
    messages, _ = template_messages(request(CONVERSATION), NoToolTemplate())
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["content"].startswith("<tool_call>\n")


def test_the_constraint_compiles_for_the_engine_and_a_bad_one_is_a_rejection() -> None:
    assert engine_constraint(request(CONVERSATION[:1])) is None
    ok = request(CONVERSATION[:1], tools=[WEATHER], constraint=OutputConstraint(kind="tool_calls", tool_choice="required"))
    assert engine_constraint(ok) is not None
    bad = request(CONVERSATION[:1], tools=[WEATHER], constraint=OutputConstraint(kind="tool_calls", tool_choice="other"))
    with pytest.raises(RequestRejected, match="no tool is named 'other'"):
        engine_constraint(bad)
