"""What evaluation reads and decides: completion records, their selection for a replay, the candidate's sampling
policy, sample files, and the gates that set the exit status."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from engine.config import EngineConfig, SpeculationConfig
from schemas.events import Completion, CompletionRecord, ErrorEvent, GenerateRequest, ReplyRoute, SamplingParams, Timings, Usage
from streams.config import CandidateSampling, KafkaSettings, load_settings
from streams.eval.candidate import derived_config
from streams.worker.completions_log import completion_record, config_fingerprint
from streams.eval.gates import add_gate_options, check_gates, parse_fraction
from streams.eval.replay import candidate_request
from streams.eval.source import Read, SourceError, load_samples, parse_duration, select_records


def _request(request_id: str = "r1", *, tenant: str = "alice", log_prompt: bool = True, max_tokens: int = 16) -> GenerateRequest:
    return GenerateRequest(request_id=request_id, prompt="Kafka is", model="m", tenant=tenant, log_prompt=log_prompt,
                           sampling=SamplingParams(max_tokens=max_tokens, seed=7), reply_to=ReplyRoute(topic="t"))


def _completion(request_id: str = "r1") -> Completion:
    return Completion(request_id=request_id, text="a log", finish_reason="stop", num_chunks=1,
                      usage=Usage(prompt_tokens=3, completion_tokens=2, total_tokens=5),
                      timings=Timings(queued_s=0.0, ttft_s=0.1, total_s=0.2))


def _record(request_id: str = "r1", **request_fields: object) -> CompletionRecord:
    return completion_record(_request(request_id, **request_fields), _completion(request_id),  # type: ignore[arg-type]
                             worker_id="w1", fingerprint="f", served_model="m")


def test_a_record_keeps_the_request_as_received_with_its_seed_and_the_answer() -> None:
    record = _record()
    assert record.request == _request() and record.sampling.seed == 7
    assert record.completion == _completion() and record.error is None
    assert (record.tenant, record.worker_id, record.config_fingerprint) == ("alice", "w1", "f")


def test_a_record_of_a_request_that_keeps_prompts_out_has_no_request_but_still_its_sampling() -> None:
    record = _record(log_prompt=False)
    assert record.request is None
    assert record.sampling.max_tokens == 16 and record.completion is not None


def test_a_record_of_a_failed_request_carries_the_error() -> None:
    error = ErrorEvent(request_id="r1", code="internal_error", message="boom")
    record = completion_record(_request(), error, worker_id="w", fingerprint="f", served_model=None)
    assert record.error == error and record.completion is None
    with pytest.raises(ValueError, match="exactly one of 'completion' and 'error'"):
        CompletionRecord.model_validate({**record.model_dump(), "completion": _completion().model_dump()})


def test_the_fingerprint_follows_what_decides_the_text_not_capacity() -> None:
    base = EngineConfig()
    assert config_fingerprint(base) == config_fingerprint(EngineConfig())
    assert config_fingerprint(base) == config_fingerprint(EngineConfig(kv_cache_bytes=1 << 26, max_running_requests=4))
    assert config_fingerprint(base) != config_fingerprint(EngineConfig(dtype="bfloat16"))
    assert config_fingerprint(base) != config_fingerprint(EngineConfig(speculation=SpeculationConfig(enabled=False)))
    assert len(config_fingerprint(base)) == 16


def test_selection_keeps_the_first_complete_record_per_request_and_counts_what_it_leaves_out() -> None:
    first = _record("r1")
    cancelled = _record("r5")
    cancelled = cancelled.model_copy(update={"completion": cancelled.completion.model_copy(  # type: ignore[union-attr]
        update={"finish_reason": "abort"})})
    read = Read(events=[first, _record("r1"), _record("r2", tenant="bob"), _record("r3", log_prompt=False),
                        _record("r4"), cancelled], unreadable=2)
    selection = select_records(read, tenant="alice")
    assert [r.request_id for r in selection.records] == ["r1", "r4"] and selection.records[0] is first
    assert selection.counts() == {"replayable": 2, "duplicates_dropped": 1, "other_tenants": 1,
                                  "prompt_not_logged": 1, "interrupted": 1, "unreadable": 2}
    assert [r.request_id for r in select_records(read, limit=1).records] == ["r1"]


def test_the_candidate_policy_caps_max_tokens_and_replaces_sampling_but_keeps_the_seed() -> None:
    record = _record(max_tokens=16)
    assert candidate_request(record, CandidateSampling()) == record.request
    capped = candidate_request(record, CandidateSampling(max_tokens_cap=4, temperature=0.7))
    assert (capped.sampling.max_tokens, capped.sampling.temperature, capped.sampling.seed) == (4, 0.7, 7)
    assert candidate_request(record, CandidateSampling(max_tokens_cap=64)).sampling.max_tokens == 16


def test_durations_read_as_seconds_and_bad_ones_are_named() -> None:
    assert parse_duration("2h") == 7200 and parse_duration("30m") == 1800 and parse_duration("1.5d") == 129600
    with pytest.raises(SourceError, match="'2 hours'"):
        parse_duration("2 hours")


def test_a_samples_file_reads_input_as_a_user_message_and_names_a_bad_line(tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text('{"id": "a", "input": "Hi", "reference": "Hello", "tags": ["greet"]}\n\n{"prompt": "Kafka is"}\n')
    samples = load_samples(good)
    assert samples[0].messages is not None and samples[0].messages[0].content == "Hi"
    assert samples[0].reference == "Hello" and samples[0].tags == ["greet"]
    assert samples[1].sample_id == "line-3" and samples[1].prompt == "Kafka is"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input": "Hi"}\n{"input": "Hi", "refrence": "x"}\n')
    with pytest.raises(SourceError, match=r"bad.jsonl line 2: unknown field 'refrence'"):
        load_samples(bad)
    twice = tmp_path / "twice.jsonl"
    twice.write_text('{"id": "a", "input": "Hi"}\n{"id": "a", "input": "Ho"}\n')
    with pytest.raises(SourceError, match="sample ids must be unique; repeated: a"):
        load_samples(twice)


def _gated(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_gate_options(parser)
    return parser.parse_args(list(argv))


def test_gates_accept_fractions_and_percentages() -> None:
    assert parse_fraction("10%") == pytest.approx(0.1) and parse_fraction("0.99") == 0.99
    with pytest.raises(argparse.ArgumentTypeError):
        parse_fraction("ten")


def test_a_gate_fails_beyond_its_threshold_and_when_its_value_was_not_measured() -> None:
    report = {"scores": {"exact_match_rate": 0.98, "reference": None,
                         "latency": {"ttft_s": {"p99": {"relative": 0.05}}}}}
    args = _gated("--min-exact-match", "0.99", "--max-p99-ttft-regression", "10%", "--min-token-f1", "0.5")
    results = {r.gate: r for r in check_gates(args, report)}
    assert not results["min-exact-match"].passed and results["min-exact-match"].value == 0.98
    assert results["max-p99-ttft-regression"].passed
    assert not results["min-token-f1"].passed and results["min-token-f1"].value is None
    assert results["min-token-f1"].describe() == "FAIL --min-token-f1 0.5: not measured"
    assert check_gates(_gated(), report) == []


def test_the_candidate_runs_its_own_file_on_the_recordings_kafka_under_a_prefix_and_group_of_its_own(
        tmp_path: Path) -> None:
    candidate = tmp_path / "candidate.yaml"
    candidate.write_text("kafka:\n  bootstrap_servers: elsewhere:9092\nengine:\n  dtype: bfloat16\n"
                         "worker:\n  group_id: specstream.engine-workers\n  heartbeat_s: 2\n")
    kafka = KafkaSettings(bootstrap_servers="broker:9093", security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                          sasl_username="eval", sasl_password="s3cret")  # type: ignore[arg-type]
    derived = derived_config(candidate, kafka, "specstream.eval-1a2b", "specstream", tmp_path)
    settings = load_settings(derived)
    assert settings.kafka.bootstrap_servers == "broker:9093" and settings.kafka.topic_prefix == "specstream.eval-1a2b"
    assert settings.kafka.sasl_password is not None and settings.kafka.sasl_password.get_secret_value() == "s3cret"
    assert settings.engine.dtype == "bfloat16" and settings.worker.heartbeat_s == 2
    assert settings.worker.group_id == "specstream.eval-1a2b.engine-workers"
    assert settings.delivery.reply_topic_patterns == ["specstream.replies.*"]
    assert derived.stat().st_mode & 0o077 == 0
