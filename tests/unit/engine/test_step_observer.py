"""Step observers: once per step, after it, a record of what the step scheduled; no record without an observer."""
from __future__ import annotations

import time

import pytest
from _engine_factories import greedy_request, make_engine, random_prompts, single_thread, tiny_hf_model  # noqa: F401

from engine.llm_engine import LLMEngine
from engine.step_record import StepRecord
from schemas.batch import BATCH_PRIORITY

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def hf():
    return tiny_hf_model("llama")


@pytest.fixture
def engine(hf) -> LLMEngine:
    return make_engine(hf)


def observed(engine: LLMEngine) -> list[StepRecord]:
    records: list[StepRecord] = []
    engine.add_step_observer(records.append)
    return records


def test_records_split_rows_by_class_and_name_the_admitted_requests(engine: LLMEngine) -> None:
    records = observed(engine)
    batch_prompt, prompt = random_prompts([6, 5])
    engine.add_request(greedy_request("b0", batch_prompt, 4, priority=BATCH_PRIORITY))
    engine.step()  # the batch line's prompt, alone
    engine.add_request(greedy_request("i0", prompt, 3))
    engine.step()  # the interactive prompt: batch lines skip this step
    engine.step()  # a decode row each

    by_class = [(r.interactive_decode_rows, r.interactive_prefill_tokens, r.batch_rows, r.admitted) for r in records]
    assert by_class == [(0, 0, 6, ("b0",)), (0, 5, 0, ("i0",)), (1, 0, 1, ())]
    assert [r.num_rows for r in records] == [6, 5, 2]


def test_the_record_holds_the_scheduler_output_and_the_step_times(engine: LLMEngine) -> None:
    records = observed(engine)
    engine.add_request(greedy_request("r", random_prompts([7])[0], 2))
    t0 = time.perf_counter()
    engine.step()
    t1 = time.perf_counter()

    (record,) = records
    assert [(s.seq.request_id, s.num_new_tokens, s.is_prefill) for s in record.batch.scheduled] == [("r", 7, True)]
    assert t0 <= record.start <= record.end <= t1
    assert record.wall_s == record.end - record.start


def test_every_step_is_observed_including_empty_ones(engine: LLMEngine) -> None:
    records = observed(engine)
    engine.add_request(greedy_request("r", random_prompts([4])[0], 2))
    while engine.has_unfinished():
        engine.step()
    engine.step()
    assert [r.is_empty for r in records] == [False, False, True]


def test_observers_run_in_registration_order(engine: LLMEngine) -> None:
    calls: list[str] = []
    engine.add_step_observer(lambda _: calls.append("first"))
    engine.add_step_observer(lambda _: calls.append("second"))
    engine.step()
    assert calls == ["first", "second"]


def test_an_observer_error_propagates_after_the_step_completed(engine: LLMEngine) -> None:
    def broken(_: StepRecord) -> None:
        raise RuntimeError("observer bug")

    engine.add_step_observer(broken)
    engine.add_request(greedy_request("r", random_prompts([5])[0], 3))
    with pytest.raises(RuntimeError, match="observer bug"):
        engine.step()
    seq = engine.scheduler.get("r")
    assert seq is not None and seq.num_computed == 5 and len(seq.output_ids) == 1


def test_no_record_is_built_without_an_observer(engine: LLMEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object, **__: object) -> StepRecord:
        raise AssertionError("record built with no observer")

    monkeypatch.setattr(StepRecord, "of", refuse)
    engine.add_request(greedy_request("r", random_prompts([5])[0], 2))
    while engine.has_unfinished():
        engine.step()
