"""n choices: seeded copies of the admitted request, merged into one OpenAI answer with summed usage."""
from __future__ import annotations

from schemas.events import (
    Completion,
    GenerateRequest,
    ReplyRoute,
    SamplingParams,
    Timings,
    Usage,
)
from streams.edge.choices import choice_requests, for_ticket, merged_body


def _request(seed: int) -> GenerateRequest:
    return GenerateRequest(request_id="chatcmpl-1", prompt="hi", model="m", reply_to=ReplyRoute(topic="t"),
                           sampling=SamplingParams(seed=seed, temperature=1.0))


def _final(text: str, prompt: int, completion: int) -> Completion:
    return Completion(request_id="x", text=text, finish_reason="stop", num_chunks=1,
                      usage=Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion),
                      timings=Timings(queued_s=0, ttft_s=0, total_s=0))


def test_choice_i_is_the_request_with_its_own_id_and_seed_plus_i() -> None:
    gens = choice_requests(_request(2**63 - 2), 3)
    assert [g.request_id for g in gens] == ["chatcmpl-1", "chatcmpl-1-1", "chatcmpl-1-2"]
    assert [g.sampling.seed for g in gens] == [2**63 - 2, 2**63 - 1, 0]  # wraps within the seed's range
    assert all(g.sampling.temperature == 1.0 and g.prompt == "hi" for g in gens)
    assert choice_requests(_request(5), 1) == [_request(5)]


def test_the_answer_indexes_the_choices_and_counts_the_prompt_once() -> None:
    finals = [_final("a", 10, 3), _final("b", 10, 5)]
    bodies = [{"id": "chatcmpl-1", "choices": [{"index": 0, "text": f.text}], "usage": {}} for f in finals]
    merged = merged_body(bodies, finals)
    assert merged["choices"] == [{"index": 0, "text": "a"}, {"index": 1, "text": "b"}]
    assert merged["usage"] == {"prompt_tokens": 10, "completion_tokens": 8, "total_tokens": 18,
                               "prompt_tokens_details": None}
    charged = for_ticket(finals).usage
    assert charged.prompt_tokens + charged.completion_tokens == 28  # each choice read its prompt
