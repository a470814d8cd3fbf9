"""A worker serving the default model with `engine.weights: int4` answers the official openai
client through the edge, and says at start that its weights are int4 (not a silent fp32), or, on a
CPU without AVX512_BF16/AMX-BF16, that it falls back to fp32 and why."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from openai import OpenAI

from engine.quant.formats import resolve_weight_format
from streams.testing.stack import DEFAULT_MODEL as MODEL
from streams.testing.stack import Stack, running_stack
from tests.kafka_fixtures import kafka_bootstrap, kafka_single  # noqa: F401  (pytest fixtures)

pytestmark = [pytest.mark.kafka, pytest.mark.model, pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def int4_stack(kafka_bootstrap: str) -> Iterator[Stack]:  # noqa: F811
    with running_stack(kafka_bootstrap, env={"SPECSTREAM_ENGINE__WEIGHTS": "int4"}) as stack:
        yield stack


def test_an_int4_worker_answers_the_openai_client_through_the_edge(int4_stack: Stack) -> None:
    client = OpenAI(base_url=int4_stack.base_url + "/v1", api_key=int4_stack.api_key, max_retries=0, timeout=120)
    response = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Name three colors."}], max_tokens=12, temperature=0
    )
    choice = response.choices[0]
    assert choice.message.content and response.usage is not None and response.usage.completion_tokens > 0
    streamed = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Name three colors."}], max_tokens=12, temperature=0,
        stream=True,
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices)
    assert text == choice.message.content  # greedy: the same int4 model, the same text
    resolved = resolve_weight_format("int4", torch.device("cpu"))  # what this CPU runs for int4
    if resolved.fmt == "int4":
        assert "weights: int4" in int4_stack.logs()
    else:  # the unit tests check int4's arithmetic on every CPU (every_format_runs)
        assert resolved.note and resolved.note in int4_stack.logs()
