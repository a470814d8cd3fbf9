"""The sampling controls travel from an OpenAI/vLLM body to the wire request and on to the engine's options."""
from __future__ import annotations

from typing import Any

import pytest

from engine.request import SamplingOptions
from streams.wire.bodies import ChatCompletionBody, CompletionBody
from streams.wire.build import sampling_of
from streams.wire.parse import parse_body

MODEL = "smollm2-135m-instruct"
CONTROLS: dict[str, Any] = {
    "presence_penalty": 0.5, "frequency_penalty": -0.25, "repetition_penalty": 1.2, "min_p": 0.05,
    "logit_bias": {"42": 100, "7": -1.5}, "stop_token_ids": [2, 9], "min_tokens": 3, "ignore_eos": True,
}


@pytest.mark.parametrize("body_type, base", [
    (ChatCompletionBody, {"messages": [{"role": "user", "content": "hi"}]}),
    (CompletionBody, {"prompt": "hi"}),
])
def test_chat_and_completions_pass_every_control_to_the_wire(body_type, base: dict) -> None:
    body = parse_body(body_type, {"model": MODEL, "max_tokens": 16, **base, **CONTROLS})
    wire = sampling_of(body, 128)
    assert wire.logit_bias == {42: 100.0, 7: -1.5}
    for name in ("presence_penalty", "frequency_penalty", "repetition_penalty", "min_p", "stop_token_ids",
                 "min_tokens", "ignore_eos"):
        assert getattr(wire, name) == CONTROLS[name], name


def test_max_completion_tokens_is_max_tokens_and_equal_values_are_accepted() -> None:
    data = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 12}
    assert sampling_of(parse_body(ChatCompletionBody, data), 128).max_tokens == 12
    assert sampling_of(parse_body(ChatCompletionBody, {**data, "max_tokens": 12}), 128).max_tokens == 12


def test_the_worker_gives_the_engine_every_control() -> None:
    from schemas.events import GenerateRequest, ReplyRoute
    from streams.worker.intake import to_engine_request

    body = parse_body(CompletionBody, {"model": MODEL, "prompt": "hi", "max_tokens": 16, **CONTROLS})
    request = GenerateRequest(request_id="r", prompt="hi", model=MODEL, sampling=sampling_of(body, 128),
                              reply_to=ReplyRoute(topic="t"))

    class Tokenizer:
        def __call__(self, text: str) -> dict[str, list[int]]:
            return {"input_ids": [1, 2]}

    options = to_engine_request(request, Tokenizer(), arrival_time=0.0).sampling
    assert options == SamplingOptions(
        max_tokens=16, seed=request.sampling.seed, ignore_eos=True, presence_penalty=0.5, frequency_penalty=-0.25,
        repetition_penalty=1.2, min_p=0.05, logit_bias=((7, -1.5), (42, 100.0)), stop_token_ids=(2, 9), min_tokens=3)
