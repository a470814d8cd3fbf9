"""Completions' prompt given as token ids (as OpenAI and vLLM take it, and lm-evaluation-harness's local-completions
sends it by default): the body's forms, the wire request, the edge's decoding and range check, the worker's intake,
and what a batch refuses."""
from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from schemas.events import ChatMessage, GenerateRequest, ReplyRoute, SamplingParams
from streams.batch.validation import LineError, parse_line
from streams.config import Settings
from streams.config.batch import BatchSettings
from streams.edge.access import prompt_hash
from streams.edge.admission.admit import admit
from streams.edge.admission.validate import Validated, fit_context
from streams.edge.keys import Principal, TenantLimits
from streams.edge.limits import MemoryLimiter
from streams.edge.settings import EdgeOptions
from streams.edge.tokenizers import Tokenizers
from streams.wire import errors
from streams.wire.bodies import CompletionBody
from streams.wire.build import build_request
from streams.wire.chat_template import prompt_token_ids
from streams.wire.parse import parse_body
from tests.tokenizer_support import loaded_tokenizers

MODEL = "smollm2-135m-instruct"
OPTS = EdgeOptions(Settings())
# lm-eval's local-completions loglikelihood payload: a batch of one tokenized prompt.
LM_EVAL = {"model": MODEL, "prompt": [[504, 3765, 314, 3542]], "temperature": 0, "max_tokens": 1, "logprobs": 1,
           "seed": 1234, "echo": True}


def _body(**fields: Any) -> CompletionBody:
    return parse_body(CompletionBody, {**LM_EVAL, **fields})


@pytest.mark.parametrize("prompt", [[504, 3765], [[504, 3765]]])
def test_a_prompt_of_token_ids_alone_or_in_a_list_of_one_is_taken_as_it_is(prompt: list[Any]) -> None:
    body = _body(prompt=prompt)
    assert (body.prompt_tokens_input(), body.prompt_input()) == ([504, 3765], None)
    gen = build_request(body, OPTS)
    assert (gen.prompt_token_ids, gen.prompt, gen.messages) == ([504, 3765], None, None)


def test_text_prompts_are_unchanged() -> None:
    for prompt in ("The sky", ["The sky"]):
        body = _body(prompt=prompt)
        assert (body.prompt_input(), body.prompt_tokens_input()) == ("The sky", None)
        assert build_request(body, OPTS).prompt_token_ids is None


@pytest.mark.parametrize(("prompt", "code"), [
    ([[1, 2], [3]], "unsupported_value"),  # several prompts in one request
    (["a", "b"], "unsupported_value"),
    ([-1, 5], "invalid_value"),
    ([], "invalid_value"),
    ([[]], "invalid_value"),
    ([1, "a"], "invalid_value"),
    ([True, 2], "invalid_value"),  # JSON true is no token id
    ([1.5], "invalid_value"),
])
def test_what_is_not_one_prompt_of_token_ids_is_a_400_naming_prompt(prompt: list[Any], code: str) -> None:
    with pytest.raises(errors.EdgeError) as caught:
        _body(prompt=prompt)
    error = caught.value
    assert (error.status, error.code, (error.param or "").split("[")[0]) == (400, code, "prompt"), error.message


def test_the_wire_request_takes_ids_with_or_without_their_text_but_never_with_messages() -> None:
    route = ReplyRoute(topic="t")
    GenerateRequest(request_id="r", prompt_token_ids=[1, 2], model=MODEL, reply_to=route)
    GenerateRequest(request_id="r", prompt_token_ids=[1, 2], prompt="ab", model=MODEL, reply_to=route)
    for bad in ({"messages": [ChatMessage(role="user", content="hi")]}, {}):
        with pytest.raises(ValidationError):
            GenerateRequest(request_id="r", model=MODEL, reply_to=route,
                            **({"prompt_token_ids": [1]} if bad else {"prompt_token_ids": None}), **bad)
    with pytest.raises(ValidationError):
        GenerateRequest(request_id="r", prompt_token_ids=[-3], model=MODEL, reply_to=route)


def test_the_worker_feeds_the_ids_to_the_model_untokenized() -> None:
    request = GenerateRequest(request_id="r", prompt_token_ids=[7, 8, 9], prompt="ignored text", model=MODEL,
                              reply_to=ReplyRoute(topic="t"))
    assert prompt_token_ids(request, tokenizer=None) == [7, 8, 9]


@pytest.fixture(scope="module")
def tokenizers() -> Tokenizers:
    return loaded_tokenizers(MODEL, 64)


async def test_the_edge_checks_the_ids_against_the_vocabulary_and_adds_their_text(tokenizers: Tokenizers) -> None:
    tokenizer = tokenizers.loaded(MODEL)
    ids = tokenizer("The sky is blue", add_special_tokens=False)["input_ids"]
    gen = build_request(_body(prompt=[ids]), OPTS)
    checked = await fit_context(gen, tokenizers, input_param="prompt", max_tokens_given=True)
    assert (checked.request.prompt, checked.request.prompt_token_ids, checked.prompt_tokens) == (
        "The sky is blue", ids, len(ids))
    assert prompt_hash(checked.request) == prompt_hash(gen.model_copy(update={"prompt": "The sky is blue"}))

    outside = build_request(_body(prompt=[ids[0], len(tokenizer)]), OPTS)
    with pytest.raises(errors.EdgeError) as caught:
        await fit_context(outside, tokenizers, input_param="prompt", max_tokens_given=True)
    assert (caught.value.status, caught.value.code, caught.value.param) == (400, "invalid_value", "prompt")
    assert f"token id {len(tokenizer)}, outside the model's vocabulary" in caught.value.message

    long = build_request(_body(prompt=[ids[0]] * 64), OPTS)
    with pytest.raises(errors.EdgeError) as caught:
        await fit_context(long, tokenizers, input_param="prompt", max_tokens_given=True)
    assert (caught.value.code, caught.value.param) == ("context_length_exceeded", "prompt")


async def test_without_a_tokenizer_ids_pass_to_the_worker_but_their_echo_is_refused() -> None:
    unknown = Tokenizers(("no-such-model",), max_model_len=64)
    unknown.start()
    try:
        plain = build_request(_body(echo=False, logprobs=None, model="no-such-model"), OPTS)
        checked = await fit_context(plain, unknown, input_param="prompt", max_tokens_given=True)
        assert (checked.request, checked.prompt_tokens) == (plain, None)
        with pytest.raises(errors.EdgeError) as caught:
            await fit_context(build_request(_body(model="no-such-model"), OPTS), unknown, input_param="prompt",
                              max_tokens_given=True)
        assert (caught.value.status, caught.value.code, caught.value.param) == (400, "unsupported_value", "echo")
    finally:
        await unknown.stop()


async def test_a_prompt_of_ids_is_charged_its_length_without_a_tokenizer() -> None:
    body = _body(echo=False, logprobs=None, max_tokens=10, prompt=list(range(1, 41)))
    request = build_request(body, OPTS)

    async def charge(tpm: int) -> None:
        principal = Principal(tenant=f"t{tpm}", key_id="k", limits=TenantLimits(tpm=tpm))
        await admit(MemoryLimiter(), principal, body, Validated(request, None), lease_ttl_s=60)

    await charge(50)  # 40 prompt tokens + 10
    with pytest.raises(errors.EdgeError) as caught:
        await charge(49)
    assert caught.value.status == 429


def test_a_batch_refuses_the_echo_of_token_ids_it_cannot_decode() -> None:
    line = b'{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": %s}'
    ok = parse_line(1, line % b'{"model": "m", "prompt": [1, 2], "max_tokens": 2}', BatchSettings())
    assert ok.body.prompt_tokens_input() == [1, 2]
    with pytest.raises(LineError) as caught:
        parse_line(1, line % b'{"model": "m", "prompt": [1, 2], "echo": true, "max_tokens": 2}', BatchSettings())
    assert caught.value.problem.param == "body.echo"


def test_sampling_of_an_lm_eval_request_is_unchanged_by_ids() -> None:
    gen = build_request(_body(), OPTS)
    assert gen.sampling == SamplingParams(max_tokens=1, temperature=0.0, seed=1234, logprobs=1, prompt_logprobs=1)
    assert gen.echo
