"""A batch's state merges forward whoever writes it; each line's outcome is journaled once per custom_id."""
from __future__ import annotations

import json
from pathlib import Path

from schemas.batch import (
    BatchRequestCounts,
    BatchState,
    line_request_id,
    parse_line_request_id,
)
from schemas.events import (
    Completion,
    ErrorEvent,
    GenerateRequest,
    ReplyRoute,
    Timings,
    Usage,
)
from streams.batch.book import merge
from streams.batch.journal import Journal
from streams.batch.outputs import outcome_of


def state(status: str = "in_progress", completed: int = 0, **fields: object) -> BatchState:
    return BatchState(id="batch_1", tenant="t", endpoint="/v1/completions", input_file_id="file-1",
                      status=status, created_at=1, expires_at=2, at=1.0,  # type: ignore[arg-type]
                      request_counts=BatchRequestCounts(total=10, completed=completed), **fields)  # type: ignore[arg-type]


def test_a_progress_update_written_after_a_cancel_does_not_undo_it() -> None:
    cancelled = merge(state(), state("cancelling", cancelling_at=5))
    assert merge(cancelled, state("in_progress", completed=4)).status == "cancelling"
    assert merge(cancelled, state("in_progress", completed=4)).request_counts.completed == 4


def test_counts_only_grow_and_set_fields_stay_set() -> None:
    merged = merge(state(completed=5, output_file_id="file-a"), state(completed=3, output_file_id=None))
    assert merged.request_counts.completed == 5 and merged.output_file_id == "file-a"


def test_finalizing_then_a_late_cancel_still_completes() -> None:
    finalizing = merge(state(), state("finalizing"))
    assert merge(finalizing, state("cancelling")).status == "finalizing"
    assert merge(merge(finalizing, state("cancelling")), state("completed")).status == "completed"


def test_line_request_ids_round_trip_and_other_ids_are_not_lines() -> None:
    assert parse_line_request_id(line_request_id("batch_ab", 12)) == ("batch_ab", 12)
    assert parse_line_request_id("chatcmpl-123") is None and parse_line_request_id("batch_x.y") is None


def request(prompt: bool = True) -> GenerateRequest:
    return GenerateRequest(request_id="batch_1.3", prompt="hi" if prompt else None, model="m",
                           messages=None if prompt else [{"role": "user", "content": "hi"}],  # type: ignore[list-item]
                           reply_to=ReplyRoute(topic="x"), created_at=100.0)


def completion() -> Completion:
    return Completion(request_id="batch_1.3", text=" there", finish_reason="length", num_chunks=0,
                      usage=Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2),
                      timings=Timings(queued_s=0, ttft_s=0, total_s=0))


def test_answers_become_openai_batch_output_lines() -> None:
    done = outcome_of(request(), "a", 3, completion())
    assert done.to_output_file and done.record["custom_id"] == "a" and done.record["error"] is None
    assert done.record["response"]["status_code"] == 200
    assert done.record["response"]["body"]["choices"][0]["text"] == " there"
    failed = outcome_of(request(False), "b", 3, ErrorEvent(request_id="batch_1.3", code="context_length_exceeded",
                                                           message="prompt has 9 tokens and max_tokens is 600: ..."))
    assert failed.outcome == "failed" and failed.record["response"]["status_code"] == 400
    assert failed.record["response"]["body"]["error"]["code"] == "context_length_exceeded"
    expired = outcome_of(request(), "c", 3, ErrorEvent(request_id="batch_1.3", code="deadline_exceeded", message="m"))
    assert expired.outcome == "expired" and expired.record["response"] is None
    assert expired.record["error"]["code"] == "batch_expired"


def test_the_journal_keeps_each_custom_id_once_across_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "batch_1.jsonl"
    journal = Journal(path)
    assert journal.add(outcome_of(request(), "a", 1, completion()))
    assert not journal.add(outcome_of(request(), "a", 1, completion()))
    with path.open("a") as out:
        out.write('{"line": 2, "outcome": "compl')  # killed mid-write
    again = Journal(path)
    assert list(again.outcomes) == ["a"] and journal.duplicates == 1
    assert again.add(outcome_of(request(), "b", 2, completion()))
    assert [json.loads(line)["record"]["custom_id"] for line in path.read_text().splitlines()[-1:]] == ["b"]
