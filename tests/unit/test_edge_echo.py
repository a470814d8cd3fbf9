"""Completions' echo: the body's rules, the wire fields it sets, the worker's prompt logprobs (the first null) and the
answer's shape (prompt then completion, in text and in every logprobs list), whole and streamed."""
from __future__ import annotations

from typing import Any

import pytest

from engine.logprobs import LogprobEntry
from engine.outputs import RequestOutput, RequestStats
from engine.request import EngineRequest
from schemas.answer import TopLogprob
from schemas.events import (
    Completion,
    GenerateRequest,
    PromptLogprob,
    ReplyRoute,
    SamplingParams,
    Timings,
    TokenLogprob,
    Usage,
)
from streams.config import Settings
from streams.edge.settings import EdgeOptions
from streams.wire import errors
from streams.wire.answers import completion_body
from streams.wire.bodies import CompletionBody
from streams.wire.build import build_request, sampling_of
from streams.wire.logprobs import StreamedEcho
from streams.wire.parse import parse_body
from streams.worker.replies import Generation, wire_prompt_logprobs

MODEL = "smollm2-135m-instruct"
LM_EVAL = {"model": MODEL, "prompt": ["The sky is blue"], "temperature": 0, "max_tokens": 1, "logprobs": 1,
           "seed": 1234, "echo": True}  # lm-evaluation-harness's local-completions loglikelihood payload

PROMPT = [PromptLogprob(token_id=1, token="The", logprob=None, top=None),
          PromptLogprob(token_id=2, token=" sky", logprob=-3.0, top=[TopLogprob(token_id=4, token=" sun", logprob=-1.0)])]
ANSWER = [TokenLogprob(token_id=3, token=" is", logprob=-0.5, top=[TopLogprob(token_id=3, token=" is", logprob=-0.5)])]


def test_lm_evals_loglikelihood_body_asks_for_prompt_logprobs_and_an_echo() -> None:
    body = parse_body(CompletionBody, LM_EVAL)
    wire = sampling_of(body, 128)
    assert (wire.max_tokens, wire.logprobs, wire.prompt_logprobs) == (1, 1, 1)
    assert body.echoes()
    scored = sampling_of(parse_body(CompletionBody, {**LM_EVAL, "max_tokens": 0}), 128)
    assert (scored.max_tokens, scored.prompt_logprobs) == (0, 1)
    plain = sampling_of(parse_body(CompletionBody, {**LM_EVAL, "logprobs": None}), 128)
    assert plain.prompt_logprobs is None  # an echo without logprobs computes none
    assert sampling_of(parse_body(CompletionBody, {**LM_EVAL, "echo": False}), 128).prompt_logprobs is None


def test_build_request_carries_echo_to_the_wire() -> None:
    gen = build_request(parse_body(CompletionBody, LM_EVAL), EdgeOptions(Settings()))
    assert gen.echo and gen.prompt == "The sky is blue"
    assert not build_request(parse_body(CompletionBody, {**LM_EVAL, "echo": None}), EdgeOptions(Settings())).echo


@pytest.mark.parametrize(("extra", "code", "param"), [
    ({"n": 2}, "unsupported_value", "echo"),
    ({"echo": False, "max_tokens": 0}, "invalid_value", "max_tokens"),
    ({"max_tokens": -1}, "invalid_value", "max_tokens"),
])
def test_what_echo_cannot_honour_is_a_400_naming_the_field(extra: dict[str, Any], code: str, param: str) -> None:
    with pytest.raises(errors.EdgeError) as caught:
        parse_body(CompletionBody, {**LM_EVAL, **extra})
    assert (caught.value.status, caught.value.code, caught.value.param) == (400, code, param)


def test_the_worker_puts_the_prompts_logprobs_on_the_first_chunk_and_the_completion_with_the_first_null() -> None:
    wire = wire_prompt_logprobs(1, [LogprobEntry(2, float("-inf"), ((4, -1.0),))], lambda t: f"<{t}>")
    assert wire == [PromptLogprob(token_id=1, token="<1>", logprob=None, top=None),
                    PromptLogprob(token_id=2, token="<2>", logprob=-9999.0,
                                  top=[TopLogprob(token_id=4, token="<4>", logprob=-1.0)])]

    request = GenerateRequest(request_id="r", prompt="ab", model=MODEL, reply_to=ReplyRoute(topic="t"),
                              sampling=SamplingParams(max_tokens=0, prompt_logprobs=1), echo=True)
    gen = Generation(request, delivery=None, transit_s=0.0,  # type: ignore[arg-type]
                     engine_request=EngineRequest("r", [1, 2]))
    out = RequestOutput("r", [], "", finished=True, finish_reason="length",
                        stats=RequestStats(prompt_tokens=2, completion_tokens=0, queued_s=0, ttft_s=0, total_s=0),
                        prompt_logprobs=[LogprobEntry(2, -3.0, ((4, -1.0),))])
    chunk = gen.chunk(out, "length", str)
    assert chunk.prompt_logprobs is not None and [p.logprob for p in chunk.prompt_logprobs] == [None, -3.0]
    assert gen.completion(out, "length", MODEL).prompt_logprobs == chunk.prompt_logprobs


def _final(text: str, logprobs: list[TokenLogprob] | None, prompt: list[PromptLogprob] | None) -> Completion:
    return Completion(request_id="r", text=text, finish_reason="length", num_chunks=1,
                      usage=Usage(prompt_tokens=2, completion_tokens=len(logprobs or []), total_tokens=3),
                      timings=Timings(queued_s=0, ttft_s=0, total_s=0), logprobs=logprobs, prompt_logprobs=prompt)


def _gen(echo: bool) -> GenerateRequest:
    return GenerateRequest(request_id="r", prompt="The sky", model=MODEL, reply_to=ReplyRoute(topic="t"), echo=echo)


def test_an_echoed_answer_is_the_prompt_then_the_completion_in_text_and_logprobs() -> None:
    choice = completion_body(_gen(True), _final(" is", ANSWER, PROMPT), chat=False)["choices"][0]
    assert choice["text"] == "The sky is"
    assert choice["logprobs"] == {
        "tokens": ["The", " sky", " is"], "token_logprobs": [None, -3.0, -0.5],
        "top_logprobs": [None, {" sun": -1.0}, {" is": -0.5}], "text_offset": [0, 3, 7]}


def test_max_tokens_zero_echoes_just_the_prompt_and_no_logprobs_asked_means_null() -> None:
    scored = completion_body(_gen(True), _final("", [], PROMPT), chat=False)["choices"][0]
    assert scored["text"] == "The sky" and scored["logprobs"]["token_logprobs"] == [None, -3.0]
    bare = completion_body(_gen(True), _final("", None, None), chat=False)["choices"][0]
    assert (bare["text"], bare["logprobs"]) == ("The sky", None)
    unechoed = completion_body(_gen(False), _final(" is", ANSWER, None), chat=False)["choices"][0]
    assert unechoed["text"] == " is" and unechoed["logprobs"]["text_offset"] == [0]


def test_a_streamed_echo_sends_the_prompt_once_and_offsets_the_answer_after_it() -> None:
    echo = StreamedEcho("The sky")
    first = echo.prompt_chunk(_final("", [], PROMPT))
    assert first is not None and first[0] == "The sky" and first[1] is not None
    assert first[1]["tokens"] == ["The", " sky"] and first[1]["text_offset"] == [0, 3]
    assert echo.answer_start == 7 and echo.prompt_chunk(_final("", [], PROMPT)) is None
