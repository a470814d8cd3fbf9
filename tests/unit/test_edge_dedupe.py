"""Exactly-once text at the client: a regenerated request's chunks are cut against what was already forwarded."""
from __future__ import annotations

import pytest

from schemas.events import Completion, SpecStats, TokenChunk, Timings, Usage
from streams.edge.dedupe import Diverged, Forwarded

ANSWER = "Kafka is a distributed log."
TOKENS = list(range(100, 100 + len(ANSWER.split(" "))))


def chunks(cuts: list[int], *, text: str = ANSWER) -> list[TokenChunk]:
    """The answer cut at the given character positions, one token per word-ish piece (offsets as a worker sets them)."""
    out, start, tokens = [], 0, 0
    for i, end in enumerate([*cuts, len(text)]):
        piece = text[start:end]
        n = max(1, piece.count(" ") + (1 if piece and not piece.endswith(" ") else 0))
        out.append(TokenChunk(request_id="r", index=i, text=piece, token_ids=list(range(tokens, tokens + n)),
                              text_offset=start, token_offset=tokens))
        start, tokens = end, tokens + n
    return out


def completion(text: str = ANSWER, num_chunks: int = 3) -> Completion:
    return Completion(request_id="r", text=text, finish_reason="stop", num_chunks=num_chunks,
                      usage=Usage(prompt_tokens=1, completion_tokens=5, total_tokens=6),
                      timings=Timings(queued_s=0, ttft_s=0, total_s=0), spec=SpecStats())


def forward_all(f: Forwarded, events: list[TokenChunk]) -> list[TokenChunk]:
    return [c for c in (f.chunk(e) for e in events) if c is not None]


def test_a_regeneration_cut_differently_continues_without_gap_or_repeat() -> None:
    f = Forwarded("r")
    first = chunks([5, 9, 11])[:2]  # the dead worker got "Kafka" and " is " out
    again = chunks([3, 14, 20])  # the new worker's steps cut the same text elsewhere
    sent = forward_all(f, first) + forward_all(f, again)
    assert "".join(c.text for c in sent) == ANSWER
    assert [c.index for c in sent] == list(range(len(sent)))
    assert [c.text_offset for c in sent] == [sum(len(c.text) for c in sent[:i]) for i in range(len(sent))]
    assert f.duplicates >= 2
    tail, final = f.completion(completion())
    assert tail is None and final.num_chunks == len(sent)


def test_exact_duplicates_are_dropped() -> None:
    f = Forwarded("r")
    events = chunks([5, 9])
    assert len(forward_all(f, events + events)) == 3
    assert f.text == ANSWER


def test_partly_new_chunk_forwards_only_its_new_part_with_its_new_tokens() -> None:
    f = Forwarded("r")
    forward_all(f, chunks([5, 9])[:1])  # "Kafka"
    whole = TokenChunk(request_id="r", index=0, text="Kafka is", token_ids=[7, 8], text_offset=0, token_offset=0)
    f2 = Forwarded("r")
    f2.chunk(TokenChunk(request_id="r", index=0, text="Kafka", token_ids=[7], text_offset=0, token_offset=0))
    fresh = f2.chunk(whole)
    assert fresh is not None and fresh.text == " is" and fresh.token_ids == [8]
    assert (fresh.index, fresh.text_offset, fresh.token_offset) == (1, 5, 1)


def test_diverged_regeneration_is_an_error_not_different_text() -> None:
    f = Forwarded("r")
    forward_all(f, chunks([5, 9])[:2])  # "Kafka is "
    other = TokenChunk(request_id="r", index=0, text="Kafka was", token_ids=[0, 1], text_offset=0, token_offset=0)
    with pytest.raises(Diverged) as err:
        f.chunk(other)
    event = err.value.event()
    assert event.code == "regeneration_diverged" and event.request_id == "r" and event.retryable


def test_diverged_completion_is_an_error() -> None:
    f = Forwarded("r")
    forward_all(f, chunks([5, 9])[:2])
    with pytest.raises(Diverged):
        f.completion(completion("Kafka was here."))


def test_a_gap_is_held_back_and_the_completion_fills_it() -> None:
    f = Forwarded("r")
    events = chunks([5, 9])
    assert f.chunk(events[0]) is not None
    assert f.chunk(events[2]) is None and f.gaps == 1  # events[1] never arrived
    tail, final = f.completion(completion())
    assert tail is not None and tail.text == ANSWER[5:] and tail.index == 1 and tail.text_offset == 5
    assert final.num_chunks == 2


def test_empty_final_chunk_is_forwarded_once() -> None:
    f = Forwarded("r")
    forward_all(f, chunks([5, 9]))
    end = TokenChunk(request_id="r", index=3, text="", token_ids=[], finish_reason="stop",
                     text_offset=len(ANSWER), token_offset=len(f.tokens))
    fresh = f.chunk(end)
    assert fresh is not None and fresh.finish_reason == "stop" and fresh.index == 3


def test_chunks_without_offsets_fall_back_to_indexes() -> None:
    f = Forwarded("r")
    legacy = [TokenChunk(request_id="r", index=i, text=t, token_ids=[i]) for i, t in enumerate(["a", "b", "c"])]
    sent = forward_all(f, legacy[:2] + legacy)
    assert [c.text for c in sent] == ["a", "b", "c"] and [c.index for c in sent] == [0, 1, 2]
