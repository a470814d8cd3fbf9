"""The Responses API's body and events, without a broker: what a request becomes on the chat path, what is refused
by name, and the stream's events checked with the `openai` package's own typed models."""
from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.responses import Response, ResponseStreamEvent, ResponseUsage
from pydantic import TypeAdapter

from schemas.answer import PromptTokensDetails
from schemas.events import Completion, ReplyRoute, SamplingParams, Timings, Usage
from streams.edge.responses.body import ResponsesBody
from streams.edge.responses.events import ResponseBuilder, answered, usage_of
from streams.edge.settings import EdgeOptions
from streams.wire import errors
from streams.wire.build import build_request, sampling_of
from streams.wire.parse import parse_body

TOOL = {"type": "function", "name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}, "strict": True}
EVENTS = TypeAdapter(ResponseStreamEvent)


def body(**fields: Any) -> ResponsesBody:
    return parse_body(ResponsesBody, {"model": "m", "input": "hi", **fields})


def refusal(**fields: Any) -> errors.EdgeError:
    with pytest.raises(errors.EdgeError) as caught:
        body(**fields).constraint()
    return caught.value


def test_instructions_come_first_and_tool_round_trip_items_become_chat_turns() -> None:
    b = body(instructions="Be brief.", input=[
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Oslo?"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Oslo"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "-3 C"}])
    roles = [(m.role, m.content) for m in b.chat_input() or []]
    assert roles == [("system", "Be brief."), ("user", "Weather in Oslo?"), ("assistant", ""), ("tool", "-3 C")]
    assert (b.chat_input() or [])[2].tool_calls[0].name == "get_weather"


def test_previous_conversation_goes_before_the_input_but_not_its_instructions() -> None:
    b = body(input="And tomorrow?", previous_response_id="resp_1")
    b.continue_from([{"type": "message", "role": "user", "content": "Weather?"},
                     {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sunny."}]}])
    assert [m.content for m in b.chat_input() or []] == ["Weather?", "Sunny.", "And tomorrow?"]
    assert b.conversation()[-1] == {"type": "message", "role": "user", "content": "And tomorrow?"}


def test_flat_function_tools_and_a_named_choice_map_onto_the_chat_paths_constraint() -> None:
    b = body(tools=[TOOL], tool_choice={"type": "function", "name": "get_weather"}, parallel_tool_calls=False)
    assert [t.name for t in b.wire_tools() or []] == ["get_weather"]
    constraint = b.constraint()
    assert constraint is not None and constraint.tool_choice == "get_weather" and not constraint.parallel_tool_calls


def test_text_format_json_schema_is_the_structured_output_path() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    constraint = body(text={"format": {"type": "json_schema", "name": "x", "schema": schema}}).constraint()
    assert constraint is not None and constraint.kind == "json" and constraint.json_schema == schema


@pytest.mark.parametrize(("fields", "param", "code"), [
    ({"max_tokens": 16}, "max_tokens", "unknown_parameter"),
    ({"stop": "x"}, "stop", "unknown_parameter"),
    ({"logit_bias": {"1": 5.0}}, "logit_bias", "unknown_parameter"),
    ({"include": ["message.output_text.logprobs"]}, "include", "unsupported_parameter"),
    ({"background": True}, "background", "unsupported_parameter"),
    ({"truncation": "auto"}, "truncation", "unsupported_parameter"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type", "unsupported_value"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
     "input[0].content[0].type", "unsupported_value"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "bogus"}}}},
     "text.format.schema", "invalid_schema"),
    ({"tools": [TOOL], "text": {"format": {"type": "json_object"}}}, "text.format", "unsupported_value"),
    ({"tool_choice": {"type": "function", "name": "nope"}, "tools": [TOOL]}, "tool_choice", "invalid_value"),
    ({"max_output_tokens": 8}, "max_output_tokens", "invalid_value"),
])
def test_what_the_chat_path_cannot_honour_is_refused_naming_the_responses_field(fields: dict[str, Any], param: str,
                                                                                code: str) -> None:
    error = refusal(**fields)
    assert (error.status, error.param, error.code) == (400, param, code)


def test_vllm_sampling_extensions_are_honoured_as_on_chat() -> None:
    sampling = sampling_of(body(top_k=5, min_p=0.1, repetition_penalty=1.2, min_tokens=20, ignore_eos=True), 64)
    assert (sampling.top_k, sampling.min_p, sampling.repetition_penalty) == (5, 0.1, 1.2)
    assert sampling.min_tokens == 20 and sampling.ignore_eos


def test_neutral_values_of_unsupported_parameters_are_accepted() -> None:
    assert body(include=[], truncation="disabled", background=False, reasoning=None).stores


def _request(b: ResponsesBody) -> Any:
    options = EdgeOptions.from_settings(None)
    return build_request(b, options, tenant="t", request_id="chatcmpl-abc", now=1.0).model_copy(
        update={"reply_to": ReplyRoute(topic="r"), "sampling": SamplingParams(max_tokens=16, seed=1)})


def _final(text: str, reason: str = "stop") -> Completion:
    return Completion(request_id="chatcmpl-abc", text=text, finish_reason=reason, num_chunks=1,  # type: ignore[arg-type]
                      usage=Usage(prompt_tokens=5, completion_tokens=3, total_tokens=8),
                      timings=Timings(queued_s=0, ttft_s=0, total_s=0))


def test_usage_reports_the_prefix_caches_hits_as_cached_input_tokens() -> None:
    final = _final("Hi").model_copy(update={"usage": Usage(
        prompt_tokens=40, completion_tokens=3, total_tokens=43, prompt_tokens_details=PromptTokensDetails(
            cached_tokens=32))})
    usage = ResponseUsage.model_validate(usage_of(final))
    assert (usage.input_tokens, usage.input_tokens_details.cached_tokens) == (40, 32)
    assert usage_of(_final("Hi"))["input_tokens_details"]["cached_tokens"] == 0


def test_a_streamed_text_answer_is_openais_event_sequence_ending_in_the_whole_object() -> None:
    b = body()
    builder = ResponseBuilder(b, _request(b))
    events = builder.start() + builder.feed("Hel") + builder.feed("lo") + builder.finish(_final("Hello"))
    typed = [EVENTS.validate_python(e) for e in events]
    assert [e.type for e in typed] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in typed] == list(range(len(typed)))
    final = Response.model_validate(events[-1]["response"])
    assert final.id == "resp_abc" and final.output_text == "Hello" and final.usage.total_tokens == 8
    whole = answered(b, _request(b), _final("Hello"))  # not streamed: the same object, but for the item ids
    strip = [{k: v for k, v in item.items() if k != "id"} for item in whole["output"]]
    assert strip == [{k: v for k, v in item.items() if k != "id"} for item in events[-1]["response"]["output"]]


def test_a_cut_off_answer_is_incomplete_with_the_reason() -> None:
    b = body(max_output_tokens=16)
    final = Response.model_validate(answered(b, _request(b), _final("Once upon", "length")))
    assert final.status == "incomplete" and final.incomplete_details.reason == "max_output_tokens"
    assert final.output[0].status == "incomplete"


def test_a_tool_call_is_a_function_call_item_with_argument_events_and_no_tag_text() -> None:
    b = body(tools=[TOOL], tool_choice="required")
    gen = _request(b).model_copy(update={"constraint": b.constraint(), "tools": b.wire_tools()})
    builder = ResponseBuilder(b, gen)
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    events = builder.start() + builder.feed(text[:20]) + builder.feed(text[20:]) + builder.finish(_final(text))
    kinds = [EVENTS.validate_python(e).type for e in events]
    assert kinds[2:] == ["response.output_item.added", "response.function_call_arguments.delta",
                         "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    [item] = Response.model_validate(events[-1]["response"]).output
    assert item.type == "function_call" and item.name == "get_weather" and json.loads(item.arguments) == {
        "city": "Oslo"} and item.call_id.startswith("call_")
