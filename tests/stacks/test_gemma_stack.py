"""Gemma 3 270M served through the whole stack (Kafka, a `specstream worker` subprocess, an edge): a raw completion
with speculation (the worker's default) is the engine's own plain greedy text, and chat is refused with a 400 naming
/v1/completions, since the base model's GGUF carries no chat template (it is never given SmolLM2's)."""
from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from engine.config import SpeculationConfig, embedded_engine_config
from engine.llm_engine import LLMEngine
from engine.request import EngineRequest, SamplingOptions
from streams.testing.stack import Stack, running_stack
from tests.kafka_fixtures import kafka_bootstrap, kafka_single  # noqa: F401  (pytest fixtures)

MODEL = "gemma-3-270m"
pytestmark = [pytest.mark.kafka, pytest.mark.model, pytest.mark.timeout(900)]
# A counting prompt: its continuation repeats the prompt's n-grams, so the worker's prompt lookup drafts tokens.
PROMPT = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"
TOKENS = 24


@pytest.fixture(scope="module")
def stack(kafka_bootstrap: str) -> Iterator[Stack]:  # noqa: F811
    with running_stack(kafka_bootstrap, env={"SPECSTREAM_ENGINE__MODEL": MODEL}, ready_timeout_s=600) as s:
        yield s


def test_a_speculated_completion_through_the_stack_is_the_engines_plain_greedy_text(stack: Stack) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True}
    response = httpx.post(stack.base_url + "/v1/completions", json=body, headers=stack.headers, timeout=300)
    assert response.status_code == 200, response.text
    served = response.json()["choices"][0]["text"]
    spec = response.json()["specstream"]["spec"]
    assert spec["drafted"] > 0 and spec["accepted"] > 0, spec  # the worker speculated (its default), and it paid

    engine = LLMEngine.from_config(embedded_engine_config(
        model=MODEL, kv_cache_bytes=1 << 27, speculation=SpeculationConfig(enabled=False)))
    prompt = list(engine.tokenizer(PROMPT)["input_ids"])
    ours = engine.generate([EngineRequest("r", prompt, SamplingOptions(max_tokens=TOKENS, ignore_eos=True))])["r"]
    assert served == ours.text and served.strip()


def test_chat_is_refused_naming_completions_for_a_model_without_a_chat_template(stack: Stack) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    response = httpx.post(stack.base_url + "/v1/chat/completions", json=body, headers=stack.headers, timeout=60)
    assert response.status_code == 400
    assert "no chat template" in response.text and "/v1/completions" in response.text
