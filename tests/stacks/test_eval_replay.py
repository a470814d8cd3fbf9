"""Evaluation by replaying the bus: a recorded session (real edge, real worker, real model) replayed by
`specstream eval replay` against candidate worker processes, and `specstream eval run` on samples.

Replaying against an identical candidate regenerates every text (greedy and seeded requests alike) and passes its
gates; a candidate that caps max_tokens lower or samples hotter gives the expected drop and fails the gate, by name.
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaProducer
from pydantic import BaseModel

from schemas.events import CompletionRecord, EvalSample
from streams.kafka import clients
from streams.config import load_settings
from streams.worker.completions_log import config_fingerprint
from streams.edge.keys import create_key
from streams.eval.source import read_topic
from streams.testing.reliability import PROMPTS, WORKER_ENV
from streams.testing.stack import REPO, Stack, running_stack
from tests.kafka_fixtures import kafka_bootstrap, kafka_single  # noqa: F401

pytestmark = [pytest.mark.kafka, pytest.mark.model, pytest.mark.timeout(900)]

MAX_TOKENS = 12
CAP = 4
CANDIDATE_ENGINE = {"max_model_len": 512, "kv_cache_bytes": "96MiB"}
# Three greedy requests and three seeded sampled ones: both kinds regenerate the same text.
SESSION = [(prompt, {"temperature": 0} if i % 2 == 0 else {"temperature": 0.8, "seed": 1000 + i})
           for i, prompt in enumerate(PROMPTS[:6])]


@dataclass
class Recorded:
    stack: Stack
    records: list[CompletionRecord]  # unique, in log order
    folder: Path

    def candidate(self, name: str, **eval_section: Any) -> Path:
        path = self.folder / f"{name}.yaml"
        config = {"engine": CANDIDATE_ENGINE, "worker": {"heartbeat_s": 1}, "eval": eval_section}
        path.write_text(json.dumps(config))  # JSON is YAML
        return path

    def eval(self, *args: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
        env = {**self.stack.env, "PYTHONPATH": str(REPO)}
        return subprocess.run([sys.executable, "-m", "streams.cli", "eval", *args], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=timeout_s)


def _completions(stack: Stack) -> list[CompletionRecord]:
    topic = f"{stack.topic_prefix}.completions"
    return asyncio.run(read_topic(stack.bootstrap_servers, topic, CompletionRecord)).events


def _wait_for_records(stack: Stack, count: int, timeout_s: float = 120.0) -> list[CompletionRecord]:
    deadline = time.monotonic() + timeout_s
    while True:
        records = _completions(stack)
        if len(records) >= count or time.monotonic() > deadline:
            return records
        time.sleep(1.0)


def _chat(stack: Stack, key: str, prompt: str, **sampling: Any) -> None:
    """One chat completion; a key created a moment ago is retried while the edge has not re-read its keys file."""
    deadline = time.monotonic() + 30.0
    while True:
        response = httpx.post(stack.base_url + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                              timeout=240.0, json={"model": stack.model, "max_tokens": MAX_TOKENS, **sampling,
                                                   "messages": [{"role": "user", "content": prompt}]})
        if response.status_code != 401 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert response.status_code == 200, response.text


async def _publish(stack: Stack, topic: str, event: BaseModel, request_id: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=stack.bootstrap_servers)
    await producer.start()
    try:
        await producer.send_and_wait(f"{stack.topic_prefix}.{topic}", clients.encode(event),
                                     key=clients.request_key(request_id))
    finally:
        await producer.stop()


@pytest.fixture(scope="module")
def recorded(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:  # noqa: F811
    folder = tmp_path_factory.mktemp("eval")
    with running_stack(kafka_bootstrap, env=WORKER_ENV) as stack:
        for prompt, sampling in SESSION:
            _chat(stack, stack.api_key, prompt, **sampling)
        # A tenant that keeps its prompts out of the log.
        assert stack.keys_file is not None
        private_key, _ = create_key(stack.keys_file, "private", log_prompts=False)
        _chat(stack, private_key, "My secret is", temperature=0)
        records = _wait_for_records(stack, len(SESSION) + 1)
        assert len(records) == len(SESSION) + 1, records
        # What a worker that regenerated a redelivered request does: record it a second time.
        asyncio.run(_publish(stack, "completions", records[0], records[0].request_id))
        yield Recorded(stack, records, folder)


def _report(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert result.stdout.strip(), f"no report (status {result.returncode}):\n{result.stderr[-3000:]}"
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def test_the_worker_records_every_finished_request_once_with_what_produced_it(recorded: Recorded) -> None:
    stack = recorded.stack
    expected_fingerprint = config_fingerprint(load_settings(recorded.candidate("same")).engine)
    for record in recorded.records:
        assert record.completion is not None and record.completion.usage.completion_tokens >= 1
        assert record.worker_id and record.served_model == stack.model
        assert record.config_fingerprint == expected_fingerprint
        assert record.sampling.seed is not None  # the edge seeds every request: replays are reproducible
    logged = [r for r in recorded.records if r.request is not None]
    assert [r.request.messages[0].content for r in logged if r.request.messages] == [p for p, _ in SESSION]
    # The private tenant's request is recorded without its prompt, but with everything else.
    private = [r for r in recorded.records if r.request is None]
    assert [r.tenant for r in private] == ["private"] and private[0].completion is not None
    assert "My secret is" not in private[0].model_dump_json()


def test_replay_against_an_identical_candidate_matches_exactly_and_passes_its_gates(recorded: Recorded) -> None:
    out = recorded.folder / "same-report"
    result = recorded.eval("replay", "--from-offset", "0", "--candidate", str(recorded.candidate("same")),
                           "--min-exact-match", "1.0", "--max-error-rate", "0", "--out", str(out))
    report = _report(result)
    assert result.returncode == 0, result.stderr[-3000:]
    assert report["recorded"]["replayable"] == len(SESSION)
    assert report["recorded"]["prompt_not_logged"] == 1
    assert report["recorded"]["duplicates_dropped"] == 1
    assert report["candidate"]["config_fingerprint"] in report["recorded"]["config_fingerprints"]
    scores = report["scores"]
    assert scores["exact_match_rate"] == 1.0
    assert scores["first_divergence"]["diverged"] == 0
    assert scores["length_ratio"]["mean"] == 1.0
    assert scores["finish_reason_changes"]["count"] == 0
    assert scores["latency"]["ttft_s"]["p99"]["candidate"] > 0
    assert "PASS --min-exact-match" in result.stderr
    assert {p.name for p in out.iterdir()} == {"report.json", "summary.png", "report.html"}


def test_replay_with_a_lower_max_tokens_cap_shortens_answers_and_fails_the_exact_match_gate(recorded: Recorded) -> None:
    result = recorded.eval("replay", "--from-offset", "0",
                           "--candidate", str(recorded.candidate("capped", candidate_sampling={"max_tokens_cap": CAP})),
                           "--min-exact-match", "0.99")
    report = _report(result)
    scores = report["scores"]
    replayed = [r for r in recorded.records if r.request is not None]
    # Exactly the answers that were already no longer than the cap survive it.
    expected = sum(r.completion.usage.completion_tokens <= CAP for r in replayed) / len(replayed)  # type: ignore[union-attr]
    assert expected < 1.0
    assert scores["exact_match_rate"] == pytest.approx(expected)
    assert scores["length_ratio"]["max"] <= 1.0 and scores["length_ratio"]["mean"] < 1.0
    for row in scores["per_request"]:
        assert row["completion_tokens"][1] <= CAP
        assert row["recorded_text"].startswith(row["candidate_text"])  # the same text, cut short
    assert result.returncode == 1
    assert "FAIL --min-exact-match 0.99" in result.stderr
    assert report["gates"]["passed"] is False


def test_replay_of_one_tenants_last_hour_with_hotter_sampling_diverges_and_fails_the_gate(recorded: Recorded) -> None:
    result = recorded.eval("replay", "--since", "1h", "--tenant", "test",
                           "--candidate", str(recorded.candidate("hot", candidate_sampling={"temperature": 1.5})),
                           "--min-exact-match", "0.9")
    report = _report(result)
    assert (report["recorded"]["replayable"], report["recorded"]["other_tenants"]) == (len(SESSION), 1)
    scores = report["scores"]
    assert scores["exact_match_rate"] < 0.9
    assert scores["first_divergence"]["diverged"] >= 1
    assert result.returncode == 1
    assert "FAIL --min-exact-match 0.9" in result.stderr


def test_eval_run_publishes_samples_and_scores_answers_against_references(recorded: Recorded) -> None:
    greedy = next(r for r in recorded.records
                  if r.request is not None and r.request.sampling.temperature == 0 and r.request.messages)
    assert greedy.request is not None and greedy.completion is not None
    samples = recorded.folder / "samples.jsonl"
    samples.write_text("\n".join(json.dumps(s) for s in [
        {"id": "known", "input": greedy.request.messages[0].content, "reference": greedy.completion.text,  # type: ignore[index]
         "tags": ["recorded"]},
        {"id": "wrong", "input": "Say the word zebra.", "reference": "An entirely different answer", "tags": ["other"]},
    ]) + "\n")
    result = recorded.eval("run", "--samples", str(samples), "--max-tokens", str(MAX_TOKENS),
                           "--min-reference-exact-match", "0.5", "--min-token-f1", "0.9")
    report = _report(result)
    scores = report["scores"]
    assert scores["reference"]["candidate"]["exact_match"] == 0.5
    assert scores["per_tag"]["recorded"]["exact_match"] == 1.0 and scores["per_tag"]["recorded"]["token_f1"] == 1.0
    assert scores["per_tag"]["other"]["exact_match"] == 0.0
    assert result.returncode == 1 and "PASS --min-reference-exact-match" in result.stderr
    assert "FAIL --min-token-f1 0.9" in result.stderr
    published = asyncio.run(read_topic(recorded.stack.bootstrap_servers, f"{recorded.stack.topic_prefix}.eval-samples",
                                       EvalSample)).events
    assert {s.sample_id for s in published} == {"known", "wrong"}
