"""Admission's checks before Kafka: encoding, JSON, unsupported parameters, ranges (parse), and the context checked
with the model's tokenizer (validate)."""
from __future__ import annotations

import json

import pytest

from schemas.events import ChatMessage, GenerateRequest, ReplyRoute, SamplingParams
from streams.edge.access import prompt_hash
from streams.edge.admission.validate import fit_context
from streams.edge.tokenizers import Tokenizers
from streams.wire import errors
from streams.wire.bodies import ChatCompletionBody
from streams.wire.parse import decode_json, parse_body
from streams.wire.unsupported import FOR_CHAT, FOR_COMPLETIONS, strip_unsupported
from tests.tokenizer_support import loaded_tokenizers

MODEL = "smollm2-135m-instruct"


def _error(fn, *args, **kwargs) -> errors.EdgeError:
    with pytest.raises(errors.EdgeError) as caught:
        fn(*args, **kwargs)
    return caught.value


@pytest.mark.parametrize(("raw", "code", "param"), [
    (b'{"model": "\xff\xfe"}', "invalid_encoding", None),
    ('{"model": "x", "messages": [{"role": "user", "content": "\\ud83d"}]}'.encode(), "invalid_encoding",
     "messages[0].content"),
    ('{"\\udc80": 1}'.encode(), "invalid_encoding", None),
    (b'{"temperature": NaN}', "invalid_json", None),
    (b'{"a": Infinity}', "invalid_json", None),
    (b"[" * 5000 + b"]" * 5000, "invalid_json", None),
    (b'{"a": ' + b'{"b": ' * 100 + b"1" + b"}" * 101, "invalid_json", None),
    (b"[1, 2]", "invalid_json", None),
    (b"   ", "invalid_json", None),
    ("\ufeff{}".encode(), "invalid_json", None),
])
def test_bodies_that_are_not_clean_utf8_json_objects_are_400_naming_the_problem(
        raw: bytes, code: str, param: str | None) -> None:
    error = _error(decode_json, raw)
    assert (error.status, error.code, error.param) == (400, code, param)
    json.dumps(error.body()).encode("utf-8")  # the error itself is always encodable


def test_valid_unicode_passes() -> None:
    assert decode_json('{"prompt": "caf\\u00e9 \\ud83d\\ude00 東京"}'.encode())["prompt"] == "café 😀 東京"


@pytest.mark.parametrize(("name", "value"), [
    ("functions", [{"name": "f"}]), ("function_call", "auto"), ("audio", {"voice": "alloy"}),
    ("modalities", ["text", "audio"]), ("store", True), ("reasoning_effort", "low"), ("prediction", {"x": 1}),
])
def test_unsupported_openai_parameters_are_named(name: str, value) -> None:
    error = _error(strip_unsupported, {"model": MODEL, name: value}, FOR_CHAT)
    assert (error.status, error.code, error.param) == (400, "unsupported_parameter", name)
    assert f"'{name}' is not supported" in error.message


def test_an_integer_is_a_valid_float() -> None:
    body = parse_body(ChatCompletionBody, {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                           "temperature": 1, "top_p": 1})
    assert (body.temperature, body.top_p) == (1.0, 1.0)


def test_neutral_values_of_unsupported_parameters_are_dropped() -> None:
    data = {"model": MODEL, "functions": [], "function_call": "none",
            "store": False, "service_tier": "auto"}
    assert strip_unsupported(data, FOR_CHAT) == {"model": MODEL}
    assert _error(strip_unsupported, {"best_of": 3}, FOR_COMPLETIONS).param == "best_of"
    assert _error(strip_unsupported, {"suffix": "end"}, FOR_COMPLETIONS).param == "suffix"
    assert strip_unsupported({"best_of": 3}, FOR_CHAT) == {"best_of": 3}  # not a chat parameter: unknown, later
    assert strip_unsupported({"functions": [{"name": "f"}]}, FOR_COMPLETIONS) == {"functions": [{"name": "f"}]}


def test_the_chat_body_refuses_an_unsupported_parameter_before_anything_else() -> None:
    error = _error(parse_body, ChatCompletionBody, {"model": MODEL, "functions": [{"name": "f"}]})
    assert (error.code, error.param) == ("unsupported_parameter", "functions")  # not the missing messages
    error = _error(parse_body, ChatCompletionBody,
                   {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "best_of": 2})
    assert (error.code, error.param) == ("unknown_parameter", "best_of")  # a completions parameter


@pytest.mark.parametrize(("body", "code", "param"), [
    ({"max_tokens": 0}, "invalid_value", "max_tokens"),
    ({"max_tokens": 40000}, "invalid_value", "max_tokens"),
    ({"temperature": 2.5}, "invalid_value", "temperature"),
    ({"temperature": -0.1}, "invalid_value", "temperature"),
    ({"top_p": 0}, "invalid_value", "top_p"),
    ({"n": 9}, "invalid_value", "n"),
    ({"n": 2, "stream": True}, "unsupported_value", "n"),
    ({"top_logprobs": 2}, "invalid_value", "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "invalid_value", "top_logprobs"),
    ({"presence_penalty": 2.5}, "invalid_value", "presence_penalty"),
    ({"frequency_penalty": -3}, "invalid_value", "frequency_penalty"),
    ({"repetition_penalty": 0}, "invalid_value", "repetition_penalty"),
    ({"min_p": 1.5}, "invalid_value", "min_p"),
    ({"logit_bias": {"12": 101}}, "invalid_value", "logit_bias"),
    ({"logit_bias": {"x": 1}}, "invalid_value", "logit_bias"),
    ({"stop_token_ids": [-1]}, "invalid_value", "stop_token_ids"),
    ({"min_tokens": 20, "max_tokens": 10}, "invalid_value", "min_tokens"),
    ({"max_tokens": 10, "max_completion_tokens": 12}, "invalid_value", "max_completion_tokens"),
    ({"ignore_eos": 1}, "invalid_value", "ignore_eos"),
    ({"stop": ["a"] * 9}, "invalid_value", "stop"),
    ({"temprature": 0.5}, "unknown_parameter", "temprature"),
    # Numbers and booleans are strict, as in OpenAI's API: true is not 1.0, "5" is not 5, 1 is not true.
    ({"top_p": True}, "invalid_value", "top_p"),
    ({"max_tokens": "5"}, "invalid_value", "max_tokens"),
    ({"stream": 1}, "invalid_value", "stream"),
    ({"stream_options": {"include_usage": "yes"}}, "invalid_value", "stream_options.include_usage"),
    ({"messages": []}, "invalid_value", "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "invalid_value", "messages[0].role"),
])
def test_out_of_range_and_unknown_parameters_name_the_field(body: dict, code: str, param: str) -> None:
    data = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **body}
    error = _error(parse_body, ChatCompletionBody, data)
    assert (error.status, error.code, error.param) == (400, code, param), error.message


def _request(messages=None, prompt=None, max_tokens=8) -> GenerateRequest:
    return GenerateRequest(
        request_id="r", model=MODEL, prompt=prompt,
        messages=[ChatMessage(role="user", content=m) for m in messages] if messages else None,
        sampling=SamplingParams(max_tokens=max_tokens), reply_to=ReplyRoute(topic="t"),
    )


@pytest.fixture(scope="module")
def tokenizers() -> Tokenizers:
    return loaded_tokenizers(MODEL, 64)


async def test_context_counted_with_the_models_tokenizer_and_chat_template(tokenizers: Tokenizers) -> None:
    from engine.model_text import load_tokenizer
    from streams.wire.chat_template import prompt_token_ids

    request = _request(messages=["What is Kafka?"])
    checked = await fit_context(request, tokenizers, input_param="messages", max_tokens_given=True)
    assert checked.request is request
    assert checked.prompt_tokens == len(prompt_token_ids(request, load_tokenizer(MODEL))) > 4

    raw = _request(prompt="one two three")
    assert (await fit_context(raw, tokenizers, input_param="prompt", max_tokens_given=True)).prompt_tokens == 3


def test_chat_for_a_model_without_a_chat_template_is_a_400_pointing_to_completions() -> None:
    """A base model (Gemma 3 270M's GGUF carries no template) is never given another model's template."""
    import copy

    from engine.model_text import load_tokenizer
    from streams.edge.admission.validate import prompt_tokens

    base = copy.deepcopy(load_tokenizer(MODEL))
    base.chat_template = None
    with pytest.raises(errors.EdgeError) as caught:
        prompt_tokens(_request(messages=["What is Kafka?"]), base, "messages")
    assert caught.value.status == 400 and caught.value.param == "messages"
    assert "no chat template" in caught.value.message and "/v1/completions" in caught.value.message
    assert prompt_tokens(_request(prompt="one two three"), base, "prompt") == 3


async def test_context_errors_name_the_prompt_or_max_tokens(tokenizers: Tokenizers) -> None:
    long = _request(prompt="word " * 80, max_tokens=1)
    with pytest.raises(errors.EdgeError) as caught:
        await fit_context(long, tokenizers, input_param="prompt", max_tokens_given=True)
    assert (caught.value.status, caught.value.code, caught.value.param) == (400, "context_length_exceeded", "prompt")
    assert "maximum context length is 64 tokens" in caught.value.message

    fits = _request(prompt="word " * 20, max_tokens=60)
    with pytest.raises(errors.EdgeError) as caught:
        await fit_context(fits, tokenizers, input_param="prompt", max_tokens_given=True)
    assert caught.value.param == "max_tokens"
    # Without an explicit max_tokens the default is capped to what the context leaves.
    capped = await fit_context(fits, tokenizers, input_param="prompt", max_tokens_given=False)
    assert capped.request.sampling.max_tokens == 64 - capped.prompt_tokens and capped.prompt_tokens > 10


async def test_without_a_tokenizer_the_length_is_left_to_the_worker() -> None:
    unknown = Tokenizers(("no-such-model",), max_model_len=64)
    unknown.start()
    request = _request(prompt="word " * 500, max_tokens=60)
    checked = await fit_context(request, unknown, input_param="prompt", max_tokens_given=True)
    assert (checked.request, checked.prompt_tokens) == (request, None)
    await unknown.stop()


def test_the_context_of_a_model_comes_from_its_config_without_weights() -> None:
    from engine.model_text import model_context

    assert model_context(MODEL) == 8192  # SmolLM2-135M's max_position_embeddings, no sliding window


def test_the_edge_loads_its_tokenizers_without_torch() -> None:
    """torch and transformers' config machinery cost an edge ~3.5 s at start and ~550 MiB, for nothing it runs."""
    from tests.import_checks import loaded_after

    code = ("import asyncio\nfrom streams.edge.tokenizers import Tokenizers\n"
            "async def main():\n"
            f"    tokenizers = Tokenizers(({MODEL!r},), None)\n    tokenizers.start()\n"
            f"    assert (await tokenizers.get({MODEL!r})).context == 2048\n"
            "asyncio.run(main())")
    assert loaded_after(code, ("torch", "sympy", "qdrant_client")) == []


def test_draft_chars_counts_the_drafted_tokens_characters_or_estimates_them(tokenizers: Tokenizers) -> None:
    tokenizer = tokenizers.loaded(MODEL)
    ids = tokenizer(" the quick brown fox")["input_ids"]
    text = tokenizer.decode(ids)
    assert tokenizers.draft_chars(MODEL, text, ids, len(ids) - 1) == len(tokenizer.decode(ids[:-1]))
    assert tokenizers.draft_chars(MODEL, text, ids, 0) == 0
    assert tokenizers.draft_chars(MODEL, text, ids, len(ids)) == len(text)
    # Text that does not start with the drafts' text (held back by a stop string): a proportional estimate.
    assert tokenizers.draft_chars(MODEL, "abcdef", ids[:2], 1) == 3


def test_prompt_hash_is_stable_and_hides_the_prompt() -> None:
    a, b = _request(messages=["secret plan"]), _request(messages=["secret plan"])
    assert prompt_hash(a) == prompt_hash(b) != prompt_hash(_request(messages=["other"]))
    assert "secret" not in prompt_hash(a) and len(prompt_hash(a)) == 16


async def test_an_empty_prompt_is_refused_naming_it(tokenizers: Tokenizers) -> None:
    with pytest.raises(errors.EdgeError) as caught:
        await fit_context(_request(prompt=""), tokenizers, input_param="prompt", max_tokens_given=True)
    assert (caught.value.status, caught.value.param) == (400, "prompt")
