"""Logprobs from the worker's reply events to OpenAI's shapes (chat and completions, whole and per chunk)."""
from __future__ import annotations

from engine.logprobs import LogprobEntry
from engine.outputs import RequestOutput
from schemas.answer import TopLogprob
from schemas.events import TokenLogprob
from streams.wire.logprobs import chat_logprobs, completion_logprobs
from streams.worker.replies import wire_logprobs

ENTRIES = [
    TokenLogprob(token_id=5, token="Hé", logprob=-0.1, top=[TopLogprob(token_id=5, token="Hé", logprob=-0.1),
                                                            TopLogprob(token_id=9, token="Hi", logprob=-2.5)]),
    TokenLogprob(token_id=7, token=" there", logprob=-1.0, top=[TopLogprob(token_id=8, token="!", logprob=-0.7),
                                                                TopLogprob(token_id=7, token=" there", logprob=-1.0)]),
]


def test_chat_logprobs_are_openais_content_list_with_bytes_and_top_logprobs() -> None:
    shaped = chat_logprobs(ENTRIES)
    assert shaped is not None and shaped["refusal"] is None
    first = shaped["content"][0]
    assert (first["token"], first["logprob"], first["bytes"]) == ("Hé", -0.1, list("Hé".encode()))
    assert [t["token"] for t in first["top_logprobs"]] == ["Hé", "Hi"]
    assert chat_logprobs(None) is None


def test_completion_logprobs_are_openais_parallel_lists_with_text_offsets() -> None:
    assert completion_logprobs(ENTRIES, text_start=4) == {
        "tokens": ["Hé", " there"], "token_logprobs": [-0.1, -1.0],
        "top_logprobs": [{"Hé": -0.1, "Hi": -2.5}, {"!": -0.7, " there": -1.0}], "text_offset": [4, 6]}


def test_the_worker_decodes_each_token_and_floors_minus_infinity() -> None:
    out = RequestOutput("r", [5], "x", logprobs=[LogprobEntry(5, float("-inf"), ((5, -0.5),))])
    wire = wire_logprobs(out.logprobs, lambda t: f"<{t}>")
    assert wire == [TokenLogprob(token_id=5, token="<5>", logprob=-9999.0,
                                 top=[TopLogprob(token_id=5, token="<5>", logprob=-0.5)])]
    assert wire_logprobs(None, None) is None
