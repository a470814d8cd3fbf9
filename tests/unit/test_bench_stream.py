"""SSE parsing, the stream checker and per-request figures of `specstream bench`. No model, no server."""
from __future__ import annotations

import pytest

from streams.bench.record import RequestRecord, StreamChecker
from streams.bench.sse import SSEParser
from streams.bench.workload import BenchRequest


def _record() -> RequestRecord:
    req = BenchRequest(index=0, workload="chat", max_tokens=8, seed=1, messages=({"role": "user", "content": "hi"},))
    rec = RequestRecord(request=req, request_id="r0", backend="test")
    rec.start = 100.0
    return rec


class TestSSE:
    def test_blank_lines_end_events_and_the_done_marker_is_an_event(self) -> None:
        p = SSEParser()
        events = p.feed(b'data: {"a": 1}\n\ndata: {"b": 2}\n\ndata: [DONE]\n\n')
        assert [e.data for e in events] == ['{"a": 1}', '{"b": 2}', "[DONE]"]
        assert all(e.event == "message" for e in events)

    def test_a_stream_split_anywhere_even_inside_a_utf8_character_parses_the_same(self) -> None:
        stream = 'data: {"text": "héllo 🌍"}\n\ndata: [DONE]\n\n'.encode()
        for cut in range(1, len(stream)):
            p = SSEParser()
            events = p.feed(stream[:cut]) + p.feed(stream[cut:])
            assert [e.data for e in events] == ['{"text": "héllo 🌍"}', "[DONE]"], cut

    def test_a_stream_fed_a_byte_at_a_time_gives_one_multiline_event_with_its_fields(self) -> None:
        stream = b"event: update\nid: 7\ndata: line one\ndata: line two\n\n"
        p = SSEParser()
        events = [e for i in range(len(stream)) for e in p.feed(stream[i:i + 1])]
        assert len(events) == 1
        assert events[0].data == "line one\nline two" and events[0].event == "update" and events[0].id == "7"

    @pytest.mark.parametrize("newline", [b"\r\n", b"\r", b"\n"])
    def test_crlf_cr_and_lf_all_end_a_line_even_split_between_reads(self, newline: bytes) -> None:
        stream = b"data: x" + newline + newline + b"data: y" + newline + newline
        p = SSEParser()
        assert [e.data for e in p.feed(stream)] == ["x", "y"]
        # CRLF split between two reads does not make an extra blank line.
        p = SSEParser()
        half = len(b"data: x") + 1
        assert [e.data for e in p.feed(stream[:half]) + p.feed(stream[half:])] == ["x", "y"]

    def test_comments_and_other_fields_are_skipped_and_an_unfinished_event_stays_pending(self) -> None:
        p = SSEParser()
        assert p.feed(b": keep-alive\n\nretry: 3000\ndata:no-space\n\n")[0].data == "no-space"
        assert p.feed(b"data: unfinished") == []
        assert p.has_partial
        assert p.feed(b"\n") == [] and p.has_partial  # fields pending until the blank line


class TestChecker:
    def test_a_good_stream_is_ok_and_yields_ttft_itl_tpot_and_speculation_counts(self) -> None:
        rec = _record()
        c = StreamChecker(rec)
        c.chunk(100.2, text="Hel", token_ids=[1], index=0)
        c.chunk(100.3, text="lo", token_ids=[2, 3], index=1, drafted=4, accepted=1)
        c.chunk(100.5, text="!", token_ids=[4], index=2, drafted=4, accepted=0)
        c.final(100.6, finish_reason="stop", num_chunks=3, text="Hello!", completion_tokens=4, prompt_tokens=9)
        c.close(100.7)
        assert rec.ok and rec.error_kind is None
        assert rec.ttft == pytest.approx(0.2)
        assert rec.e2e == pytest.approx(0.6)
        assert rec.output_tokens == 4
        assert rec.tpot == pytest.approx(0.4 / 3)
        # ITL: a 0.1 s gap shared by 2 tokens, then 0.2 s for 1 token.
        assert rec.itl == pytest.approx([0.05, 0.05, 0.2])
        assert rec.inter_chunk == pytest.approx([0.1, 0.2])
        assert rec.max_itl == pytest.approx(0.2)
        assert (rec.spec_drafted, rec.spec_accepted, rec.spec_steps) == (8, 1, 2)

    def test_a_gap_in_chunk_indices_is_a_protocol_error(self) -> None:
        rec = _record()
        c = StreamChecker(rec)
        c.chunk(100.1, text="a", token_ids=[1], index=0)
        c.chunk(100.2, text="c", token_ids=[3], index=2)
        c.final(100.3, finish_reason="stop", num_chunks=3, text="ac", completion_tokens=2)
        assert not rec.ok and rec.error_kind == "protocol:gap"
        assert "protocol:missing_chunks" in rec.violations

    def test_a_repeated_chunk_index_is_a_protocol_error_and_not_counted_twice(self) -> None:
        rec = _record()
        c = StreamChecker(rec)
        c.chunk(100.1, text="a", token_ids=[1], index=0)
        c.chunk(100.2, text="a", token_ids=[1], index=0)
        c.chunk(100.3, text="b", token_ids=[2], index=1)
        c.final(100.4, finish_reason="stop", num_chunks=2, text="ab", completion_tokens=2)
        assert not rec.ok and rec.error_kind == "protocol:repeat"
        assert rec.token_ids == [1, 2]  # the duplicate is not counted

    def test_a_stream_closed_without_a_final_event_is_a_protocol_error(self) -> None:
        rec = _record()
        c = StreamChecker(rec)
        c.chunk(100.1, text="a", token_ids=[1], index=0)
        c.close(100.2)
        assert not rec.ok and rec.error_kind == "protocol:missing_final"

    def test_usage_disagreeing_with_the_tokens_received_is_a_protocol_error(self) -> None:
        rec = _record()
        c = StreamChecker(rec)
        c.chunk(100.1, text="ab", token_ids=[1, 2], index=0)
        c.final(100.2, finish_reason="length", num_chunks=1, text="ab", completion_tokens=3)
        assert rec.error_kind == "protocol:token_count"

    def test_a_final_text_unlike_the_chunks_and_a_chunk_after_the_final_are_protocol_errors(self) -> None:
        rec = _record()
        c = StreamChecker(rec)
        c.chunk(100.1, text="ab", token_ids=[1, 2], index=0)
        c.final(100.2, finish_reason="stop", num_chunks=1, text="abc", completion_tokens=2)
        c.chunk(100.3, text="z", token_ids=[9], index=1)
        assert rec.error_kind == "protocol:text_mismatch"
        assert "protocol:after_final" in rec.violations

    def test_error_event_and_no_ttft_for_failures(self) -> None:
        rec = _record()
        c = StreamChecker(rec)
        c.error(100.01, "error:overloaded", "busy")
        c.close(100.02)
        assert not rec.ok and rec.error_kind == "error:overloaded" and rec.ttft is None

    def test_without_token_ids_the_usage_is_taken_unchecked(self) -> None:
        rec = _record()
        c = StreamChecker(rec)
        c.chunk(100.1, text="a")
        c.chunk(100.2, text="b")
        c.final(100.3, finish_reason="stop", completion_tokens=5)
        assert rec.ok  # token ids unknown: usage cannot be checked against them
        assert rec.output_tokens == 5 and not rec.token_ids_known

    def test_a_stream_without_the_done_marker_is_a_protocol_error(self) -> None:
        rec = _record()
        c = StreamChecker(rec)
        c.chunk(100.1, text="a", token_ids=[1], index=0)
        c.final(100.2, finish_reason="stop", num_chunks=1, completion_tokens=1)
        c.close(100.3, done_marker=False)
        assert rec.error_kind == "protocol:missing_done"
