"""Prompts rendered with the real tokenizer, and the sampling parameters carried into the engine request."""
from __future__ import annotations

import pytest

from schemas.events import GenerateRequest
from streams.wire.chat_template import prompt_token_ids
from streams.worker.intake import to_engine_request


def body(**fields: object) -> dict:
    request = {"request_id": "r1", "prompt": "hi", "model": "m", "reply_to": {"topic": "replies", "partition": 0}}
    request.update(fields)
    return request


@pytest.fixture(scope="module")
def tokenizer():
    from engine.model_text import load_tokenizer

    return load_tokenizer("smollm2-135m-instruct")


@pytest.mark.model
def test_chat_messages_use_the_chat_template(tokenizer) -> None:
    request = GenerateRequest.model_validate(body(prompt=None, messages=[{"role": "user", "content": "Hello"}]))
    ids = prompt_token_ids(request, tokenizer)
    text = tokenizer.decode(ids)
    assert text.endswith("<|im_start|>assistant\n")  # add_generation_prompt=True
    assert "<|im_start|>user\nHello<|im_end|>" in text


@pytest.mark.model
def test_raw_prompt_is_tokenized_as_is(tokenizer) -> None:
    request = GenerateRequest.model_validate(body(prompt="Once upon a time"))
    ids = prompt_token_ids(request, tokenizer)
    assert tokenizer.decode(ids) == "Once upon a time"


@pytest.mark.model
def test_engine_request_carries_the_sampling_parameters(tokenizer) -> None:
    request = GenerateRequest.model_validate(body(
        sampling={"max_tokens": 9, "temperature": 0.7, "top_p": 0.9, "top_k": 5, "seed": 3, "stop": ["."],
                  "speculation": False},
        priority=-2, deadline=123.0,
    ))
    engine_request = to_engine_request(request, tokenizer, arrival_time=100.0)
    sampling = engine_request.sampling
    assert (sampling.max_tokens, sampling.temperature, sampling.top_p, sampling.top_k, sampling.seed) == (
        9, 0.7, 0.9, 5, 3)
    assert sampling.stop == (".",)
    assert (engine_request.priority, engine_request.deadline, engine_request.speculation) == (-2, 123.0, False)
    assert engine_request.arrival_time == 100.0 and engine_request.request_id == "r1"
