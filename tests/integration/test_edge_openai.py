"""OpenAI compatibility, checked with the official `openai` client against an edge on the real worker and Kafka.

Chat completions and completions, streamed and not; ``stop``, ``seed``,
``max_tokens``, ``temperature``, ``top_p``, ``n=1``, ``user``,
``stream_options.include_usage``; usage and finish_reason; ``/v1/models``;
errors as the client's typed exceptions with OpenAI's ``code`` and ``param``;
the ``specstream`` extra field. Answers are a few tokens long.
"""
from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from openai import OpenAI

from streams.edge.keys import create_key
from streams.edge.server import serve_in_thread
from streams.testing.stack import DEFAULT_MODEL as MODEL
from streams.testing.stack import Stack
from tests.edge_support import edge_options, shared_worker, wait_ready
from tests.kafka_fixtures import kafka_bootstrap, kafka_single  # noqa: F401  (pytest fixtures)

pytestmark = [pytest.mark.kafka, pytest.mark.model, pytest.mark.timeout(400)]

QUESTION = [{"role": "user", "content": "Name three colors."}]
PROMPT = "The three primary colors are"


@pytest.fixture(scope="session")
def edge_worker(kafka_bootstrap: str) -> Iterator[Stack]:  # noqa: F811
    yield from shared_worker(kafka_bootstrap)


@pytest.fixture(scope="module")
def setup(kafka_bootstrap: str, edge_worker: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:  # noqa: F811
    keys_file: Path = tmp_path_factory.mktemp("keys") / "keys.json"
    key, _ = create_key(keys_file, "openai-tests")
    limited, _ = create_key(keys_file, "one-per-minute", rpm=1)
    options = edge_options(kafka_bootstrap, edge_worker.topic_prefix, f"oai-{uuid.uuid4().hex[:6]}", keys_file)
    with serve_in_thread(options) as edge:
        wait_ready(edge.base_url, edge_worker)
        yield {"edge": edge, "key": key, "limited": limited}


@pytest.fixture(scope="module")
def client(setup: dict) -> OpenAI:
    return OpenAI(base_url=setup["edge"].base_url + "/v1", api_key=setup["key"], max_retries=0, timeout=120)


def test_the_served_model_is_listed_and_retrievable_and_an_unknown_one_is_404(client: OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL] and models.data[0].object == "model"
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("gpt-9")
    assert caught.value.code == "model_not_found" and caught.value.param == "model"


def test_chat_accepts_every_sampling_parameter_and_a_seed_repeats_the_text(client: OpenAI) -> None:
    response = client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=6, temperature=0.7, top_p=0.9, seed=11, n=1, user="user-42",
    )
    assert response.object == "chat.completion" and response.id.startswith("chatcmpl-") and response.model == MODEL
    assert len(response.choices) == 1
    choice = response.choices[0]
    assert choice.index == 0 and choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("length", "stop")
    usage = response.usage
    assert usage.prompt_tokens > 5 and 0 < usage.completion_tokens <= 6
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    if choice.finish_reason == "length":
        assert usage.completion_tokens == 6
    extra = response.model_extra["specstream"]
    assert set(extra["spec"]) == {"drafted", "accepted", "acceptance_rate", "tokens_per_forward"}
    # Same seed and parameters: same text, even when sampling.
    again = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=6, temperature=0.7, top_p=0.9,
                                           seed=11)
    assert again.choices[0].message.content == choice.message.content


def test_max_tokens_and_finish_reason_length(client: OpenAI) -> None:
    response = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3)
    assert response.choices[0].finish_reason == "length" and response.usage.completion_tokens == 3
    chat = client.chat.completions.create(model=MODEL, messages=QUESTION, max_completion_tokens=2)
    assert chat.usage.completion_tokens == 2


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_stop_ends_the_text_before_the_stop_string(client: OpenAI, api: str) -> None:
    def run(**kw) -> tuple[str, str]:
        if api == "chat":
            r = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=16, seed=3, **kw)
            return r.choices[0].message.content, r.choices[0].finish_reason
        r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, seed=3, **kw)
        return r.choices[0].text, r.choices[0].finish_reason

    full, _ = run()
    words = [w for w in full.split() if w.isalpha() and full.index(w) >= 3]
    assert words, f"no word to stop at in {full!r}"
    stop = words[0]
    text, finish = run(stop=[stop, "never-appears"])
    assert finish == "stop" and text == full[: full.index(stop)], (full, stop, text)
    text_single, _ = run(stop=stop)  # a single string works too
    assert text_single == text


def test_chat_stream_with_include_usage_matches_the_unstreamed_answer(client: OpenAI) -> None:
    full = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8, seed=5)
    stream = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8, seed=5, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    usage_chunks = [c for c in chunks if c.usage is not None]
    assert len(usage_chunks) == 1 and usage_chunks[0] is chunks[-1] and chunks[-1].choices == []
    assert usage_chunks[0].usage.completion_tokens == full.usage.completion_tokens
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [full.choices[0].finish_reason]
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) >= 2  # streamed in steps


def test_the_next_turn_of_a_conversation_reports_its_cached_prompt_tokens_and_the_same_text(client: OpenAI) -> None:
    conversation = uuid.uuid4().hex  # first in the prompt: no earlier test's blocks match
    system = {"role": "system", "content": f"Session {conversation}. You are a terse assistant who answers in "
              "one short sentence about colors, paint, light and how people see them."}
    turn1 = [system, {"role": "user", "content": "Name three colors."}]
    key = {"prompt_cache_key": conversation}
    first = client.chat.completions.create(model=MODEL, messages=turn1, max_tokens=8, extra_body=key)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    turn2 = [*turn1, {"role": "assistant", "content": first.choices[0].message.content},
             {"role": "user", "content": "And three more?"}]
    cold = client.chat.completions.create(model=MODEL, messages=turn2, max_tokens=8, seed=3, temperature=0.7,
                                          extra_body=key)
    # Turn 1's prompt (whole blocks of 16) was not computed again.
    assert cold.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens // 16 * 16 - 16 > 0
    warm = client.chat.completions.create(model=MODEL, messages=turn2, max_tokens=8, seed=3, temperature=0.7,
                                          extra_body=key)
    assert warm.usage.prompt_tokens_details.cached_tokens > cold.usage.prompt_tokens_details.cached_tokens
    assert warm.choices[0].message.content == cold.choices[0].message.content


def test_chat_stream_without_include_usage_has_no_usage(client: OpenAI) -> None:
    chunks = list(client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=3, stream=True))
    assert all(c.usage is None for c in chunks) and chunks[-1].choices[0].finish_reason in ("length", "stop")


def test_a_streamed_completion_adds_up_to_the_unstreamed_one(client: OpenAI) -> None:
    full = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, seed=9)
    assert full.object == "text_completion" and full.id.startswith("cmpl-") and full.choices[0].text
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, seed=9, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == \
        [full.choices[0].finish_reason]


def test_the_openai_client_raises_typed_errors_naming_the_code_and_param(setup: dict, client: OpenAI) -> None:
    base = setup["edge"].base_url + "/v1"
    with pytest.raises(openai.AuthenticationError) as caught:
        OpenAI(base_url=base, api_key="sk-ss-wrong", max_retries=0).models.list()
    assert caught.value.status_code == 401 and caught.value.code == "invalid_api_key"

    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "word " * 600}],
                                       max_tokens=4)
    assert (caught.value.code, caught.value.param) == ("context_length_exceeded", "messages")
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=600)
    assert (caught.value.code, caught.value.param) == ("context_length_exceeded", "max_tokens")
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=QUESTION, n=9)
    assert caught.value.param == "n"
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=QUESTION, logit_bias={"1": 101})
    assert (caught.value.code, caught.value.param) == ("invalid_value", "logit_bias")
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=3)
    assert caught.value.param == "temperature" and caught.value.type == "invalid_request_error"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-9", messages=QUESTION)
    with pytest.raises(openai.BadRequestError) as caught:  # an error the stream reports before its first chunk
        client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=600, stream=True)
    assert caught.value.code == "context_length_exceeded"

    limited = OpenAI(base_url=base, api_key=setup["limited"], max_retries=0, timeout=120)
    limited.completions.create(model=MODEL, prompt="hi", max_tokens=1)
    with pytest.raises(openai.RateLimitError) as caught:
        limited.completions.create(model=MODEL, prompt="hi", max_tokens=1)
    assert caught.value.code == "rate_limit_exceeded" and int(caught.value.response.headers["retry-after"]) >= 1


def test_runtime_lora_updates_are_refused_unless_the_operator_allows_them(setup: dict) -> None:
    # Default off, as vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING: a key alone must not make workers read a folder.
    for route in ("load", "unload"):
        response = httpx.post(f"{setup['edge'].base_url}/v1/{route}_lora_adapter",
                              json={"lora_name": "x", "lora_path": "/etc"},
                              headers={"Authorization": f"Bearer {setup['key']}"}, timeout=30)
        assert response.status_code == 403, response.text
        error = response.json()["error"]
        assert error["code"] == "lora_updates_disabled" and "engine.lora.runtime_updates" in error["message"]


def test_logit_bias_forces_a_token_and_stop_token_ids_end_on_it(client: OpenAI) -> None:
    from engine.model_text import load_tokenizer

    tokenizer = load_tokenizer(MODEL)
    blue = tokenizer(" blue", add_special_tokens=False)["input_ids"][0]
    forced = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0,
                                       logit_bias={str(blue): 100})
    assert forced.choices[0].text == tokenizer.decode([blue] * 4)
    stopped = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, logit_bias={str(blue): 100},
                                        extra_body={"stop_token_ids": [blue]})
    assert (stopped.choices[0].finish_reason, stopped.choices[0].text) == ("stop", "")
    assert stopped.usage is not None and stopped.usage.completion_tokens == 1


def test_seeded_penalties_are_the_same_text_with_and_without_speculation(client: OpenAI) -> None:
    extras = {"repetition_penalty": 1.3, "min_p": 0.05, "min_tokens": 12, "top_k": 40}
    answers = [
        client.chat.completions.create(
            model=MODEL, messages=QUESTION, max_completion_tokens=16, temperature=0.9, seed=7, presence_penalty=0.5,
            frequency_penalty=0.3, extra_body={**extras, "speculation": speculation})
        for speculation in (False, True, True)
    ]
    texts = [a.choices[0].message.content for a in answers]
    assert texts[0] and texts[0] == texts[1] == texts[2]
    assert all(a.usage is not None and a.usage.completion_tokens >= 12 for a in answers)


def test_logprobs_in_openais_shapes_streamed_and_not(client: OpenAI) -> None:
    whole = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8, logprobs=True,
                                           top_logprobs=3)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens and all(len(t.top_logprobs) == 3 for t in content)
    # Greedy, no processors: each token is the most likely one at its position.
    assert all(t.token == t.top_logprobs[0].token and abs(t.logprob - t.top_logprobs[0].logprob) < 1e-6
               for t in content)
    assert "".join(t.token for t in content).startswith(whole.choices[0].message.content[:5])
    streamed = [t for c in client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8,
                                                          logprobs=True, top_logprobs=3, stream=True)
                if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [t.token for t in streamed] == [t.token for t in content]
    assert max(abs(a.logprob - b.logprob) for a, b in zip(streamed, content)) < 1e-3

    completion = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, logprobs=2)
    lp = completion.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == completion.usage.completion_tokens
    assert all(len(top) == 2 for top in lp.top_logprobs) and lp.text_offset[0] == 0
    assert "".join(lp.tokens) == completion.choices[0].text


def test_the_websocket_carries_logprobs_per_chunk_and_whole_in_the_done_frame(setup: dict, client: OpenAI) -> None:
    import asyncio
    import json

    import websockets

    ask = {"model": MODEL, "messages": QUESTION, "max_tokens": 8, "logprobs": True, "top_logprobs": 2}

    async def run() -> list[dict]:
        url = setup["edge"].base_url.replace("http://", "ws://") + "/v1/ws"
        async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {setup['key']}"}) as ws:
            await ws.send(json.dumps({"id": 1, **ask}))
            frames = []
            async for frame in ws:
                frames.append(json.loads(frame))
                if frames[-1]["type"] in ("done", "error"):
                    return frames
        return frames

    frames = asyncio.run(run())
    done = frames[-1]
    assert done["type"] == "done", done
    whole = done["logprobs"]["content"]
    per_chunk = [t for f in frames[:-1] for t in f["logprobs"]["content"]]
    assert [t["token"] for t in per_chunk] == [t["token"] for t in whole] and len(whole) == done["usage"][
        "completion_tokens"]
    assert all(len(t["top_logprobs"]) == 2 for t in whole)
    http = client.chat.completions.create(**ask).choices[0].logprobs.content
    assert [t.token for t in http] == [t["token"] for t in whole]
    assert max(abs(a.logprob - b["logprob"]) for a, b in zip(http, whole)) < 1e-3


def test_n_choices_are_seeded_sequences_with_summed_usage(client: OpenAI) -> None:
    ask = {"model": MODEL, "messages": QUESTION, "max_tokens": 8, "temperature": 1.0, "seed": 40}
    both = client.chat.completions.create(n=2, **ask)
    assert [c.index for c in both.choices] == [0, 1]
    texts = [c.message.content for c in both.choices]
    assert client.chat.completions.create(n=2, **ask).choices[1].message.content == texts[1]  # regenerated: same
    # Choice i is the single answer with seed + i.
    assert client.chat.completions.create(**ask).choices[0].message.content == texts[0]
    assert client.chat.completions.create(**{**ask, "seed": 41}).choices[0].message.content == texts[1]
    singles = [client.chat.completions.create(**{**ask, "seed": 40 + i}).usage for i in range(2)]
    assert both.usage.prompt_tokens == singles[0].prompt_tokens
    assert both.usage.completion_tokens == sum(u.completion_tokens for u in singles)
    completion = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, n=3, temperature=1.0, seed=2)
    assert [c.index for c in completion.choices] == [0, 1, 2]


def _close(a: list[float | None], b: list[float | None]) -> bool:
    return len(a) == len(b) and all((x is None) == (y is None) and (x is None or abs(x - y) < 1e-3) for x, y in zip(a, b))


def test_echo_with_logprobs_scores_the_prompt_as_lm_evals_loglikelihood_asks_streamed_and_not(client: OpenAI) -> None:
    # lm-evaluation-harness's local-completions loglikelihood payload: it reads token_logprobs[ctxlen:-1].
    scored = client.completions.create(model=MODEL, prompt=[PROMPT], max_tokens=1, logprobs=1, echo=True,
                                       temperature=0, seed=1234)
    choice, n = scored.choices[0], scored.usage.prompt_tokens
    lp = choice.logprobs
    assert choice.text.startswith(PROMPT) and len(choice.text) > len(PROMPT)
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n + 1
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None and lp.text_offset[0] == 0
    assert all(x is not None and x <= 0 for x in lp.token_logprobs[1:])
    assert all(len(top) == 1 for top in lp.top_logprobs[1:]) and lp.text_offset == sorted(lp.text_offset)
    assert abs(lp.token_logprobs[-1] - max(lp.top_logprobs[-1].values())) < 1e-6  # greedy: lm-eval's is_greedy

    # max_tokens 0: the prompt alone, with the same logprobs (its KV cached by now: computed again all the same).
    only = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0, logprobs=1, echo=True)
    assert only.choices[0].text == PROMPT and only.usage.completion_tokens == 0
    assert only.choices[0].finish_reason == "length"
    assert only.choices[0].logprobs.tokens == lp.tokens[:n]
    assert _close(only.choices[0].logprobs.token_logprobs, lp.token_logprobs[:n])

    # Streamed: the prompt's chunk (with its logprobs) first, then the answer's, offsets after the prompt's.
    chunks = [c for c in client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, logprobs=1, echo=True,
                                                   temperature=0, stream=True) if c.choices]
    first = chunks[0].choices[0]
    assert first.text == PROMPT and first.logprobs.tokens == lp.tokens[:n]
    assert _close(first.logprobs.token_logprobs, lp.token_logprobs[:n])
    assert "".join(c.choices[0].text for c in chunks) == choice.text
    rest = [c.choices[0].logprobs for c in chunks[1:] if c.choices[0].logprobs is not None]
    assert [o for r in rest for o in r.text_offset] == lp.text_offset[n:]

    # An echo without logprobs: the text only.
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, echo=True)
    assert plain.choices[0].text.startswith(PROMPT) and plain.choices[0].logprobs is None
