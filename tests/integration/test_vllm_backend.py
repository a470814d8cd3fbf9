"""engine.backend: vllm — vLLM's engine behind the same topics, through the real broker and edge.

One stack for the module: an edge and a worker started as ``specstream worker`` with ``SPECSTREAM_ENGINE__BACKEND=vllm``,
which moves itself into vLLM's environment (.venv-vllm, installed by ``./dev setup vllm``) and serves the default
model in bf16 with vLLM's v1 engine.
"""
from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai import BadRequestError, OpenAI

from streams.commands.vllm_env import vllm_python
from streams.testing.stack import Stack, running_stack
from tests.kafka_fixtures import kafka_bootstrap, kafka_single  # noqa: F401  (pytest fixtures)

pytestmark = [pytest.mark.kafka, pytest.mark.model]

MODEL = "smollm2-135m-instruct"
PROMPT = [{"role": "user", "content": "Name three colours of the rainbow."}]


@pytest.fixture(scope="module")
def stack(kafka_bootstrap: str) -> Iterator[Stack]:  # noqa: F811
    assert vllm_python().is_file(), "vLLM's environment is missing: ./dev setup vllm (./dev test installs it)"
    env = {"SPECSTREAM_ENGINE__BACKEND": "vllm", "SPECSTREAM_ENGINE__MAX_MODEL_LEN": "1024",
           "SPECSTREAM_ENGINE__KV_CACHE_BYTES": "512MiB", "VLLM_CPU_OMP_THREADS_BIND": "0-1"}
    with running_stack(kafka_bootstrap, env=env, ready_timeout_s=600) as running:
        yield running


@pytest.fixture(scope="module")
def client(stack: Stack) -> OpenAI:
    return OpenAI(base_url=f"http://127.0.0.1:{stack.port}/v1", api_key=stack.api_key, max_retries=0, timeout=300)


def _worker_log(stack: Stack) -> str:
    return next(Path(p.log).read_text() for p in stack.processes if p.name == "worker")


def test_the_worker_runs_vllms_engine(stack: Stack) -> None:
    log = _worker_log(stack)
    assert "engine.backend is vllm: continuing in" in log and "starting vLLM's engine" in log


def test_a_streamed_chat_adds_up_to_the_unstreamed_greedy_answer(client: OpenAI) -> None:
    whole = client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=24, temperature=0)
    assert whole.choices[0].message.content and whole.choices[0].finish_reason == "length"
    assert whole.usage is not None and whole.usage.completion_tokens == 24
    stream = client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=24, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_greedy_repeats_and_stop_ends_the_text_before_the_stop_string(client: OpenAI) -> None:
    # Greedy only: with speculation on, vLLM-CPU 0.32 does not regenerate seeded samples (docs/backends.md).
    full = client.completions.create(model=MODEL, prompt="One, two, three, four,", max_tokens=16, temperature=0)
    again = client.completions.create(model=MODEL, prompt="One, two, three, four,", max_tokens=16, temperature=0)
    assert again.choices[0].text == full.choices[0].text
    cut = full.choices[0].text.split(",")[1]
    stopped = client.completions.create(model=MODEL, prompt="One, two, three, four,", max_tokens=16, temperature=0,
                                        stop=[cut])
    assert stopped.choices[0].finish_reason == "stop"
    assert full.choices[0].text.startswith(stopped.choices[0].text) and cut not in stopped.choices[0].text


def test_logprobs_come_back_in_openais_shape(client: OpenAI) -> None:
    answer = client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=4, temperature=0,
                                            logprobs=True, top_logprobs=2)
    content = answer.choices[0].logprobs.content
    assert len(content) == 4
    for entry in content:
        assert len(entry.top_logprobs) == 2 and entry.logprob <= 0
        # Greedy: the chosen token is the most likely one.
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-4)


def test_what_this_backend_cannot_run_is_refused_naming_it(client: OpenAI) -> None:
    with pytest.raises(BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=8,
                                       response_format={"type": "json_object"})
    assert "vLLM backend" in str(refused.value)
    # Our per-request extension: vLLM speculates for every request or none, so turning it off is refused.
    with pytest.raises(BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=8, extra_body={"speculation": False})
    assert "speculation: false" in str(refused.value)


def test_a_client_that_stops_reading_cancels_and_the_worker_serves_on(stack: Stack, client: OpenAI) -> None:
    async def start_and_drop() -> None:
        async with httpx.AsyncClient(timeout=120) as http, http.stream(
                "POST", f"http://127.0.0.1:{stack.port}/v1/completions",
                headers={"Authorization": f"Bearer {stack.api_key}"},
                json={"model": MODEL, "prompt": "Count to a thousand:", "max_tokens": 900, "stream": True,
                      "user": f"drop-{uuid.uuid4().hex[:6]}"}) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["text"]:
                    return  # leaving the block closes the connection mid-stream

    asyncio.run(start_and_drop())
    after = client.completions.create(model=MODEL, prompt="Hello", max_tokens=4, temperature=0)
    assert after.choices[0].finish_reason == "length"
    assert "cancel" in _worker_log(stack).lower()
