"""A real client's test suite: lm-evaluation-harness against the edge, scored equal to lm-eval's own ``hf`` model.

``specstream eval run --lm-eval --hf`` runs the two bundled tasks (streams/eval/lm_eval_tasks, no hub access)
through an edge on the real worker and Kafka: ``specstream_mc`` (multiple choice by log-likelihood) with lm-eval's
``local-completions``, which sends its prompts as token ids with ``echo`` and ``logprobs``, and ``specstream_gen``
(greedy generation, exact match) with ``local-chat-completions``. Then lm-eval's ``hf`` model scores the same tasks
on the same weights (the default model's GGUF, dequantised by transformers, fp32 on the CPU, as the worker runs it)
and every metric must agree within the harness's stderr. The worker is the module's own, on fp32.
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import OpenAI
from pydantic import ValidationError

from schemas.events import GenerateRequest
from streams.cli import main
from streams.testing.stack import DEFAULT_MODEL as MODEL
from streams.testing.stack import Stack
from tests.edge_support import MAX_MODEL_LEN, keyed_edge, request_topic_messages, worker_stack
from tests.kafka_fixtures import kafka_bootstrap, kafka_single  # noqa: F401  (pytest fixtures)

pytestmark = [pytest.mark.kafka, pytest.mark.model, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def edge_worker(kafka_bootstrap: str) -> Iterator[Stack]:  # noqa: F811
    with worker_stack(kafka_bootstrap, SPECSTREAM_ENGINE__WEIGHTS="fp32") as stack:  # transformers' weights
        yield stack


@pytest.fixture(scope="module")
def edge(kafka_bootstrap: str, edge_worker: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:  # noqa: F811
    with keyed_edge(kafka_bootstrap, edge_worker, tmp_path_factory.mktemp("keys"), "lm-eval", "lme") as (url, key):
        yield {"base_url": url, "key": key, "prefix": edge_worker.topic_prefix}


def test_a_prompt_of_token_ids_echoes_its_text_and_scores_like_the_same_text(edge: dict) -> None:
    from engine.model_text import load_tokenizer

    client = OpenAI(base_url=edge["base_url"] + "/v1", api_key=edge["key"], max_retries=0, timeout=120)
    text = "The capital of France is Paris"
    ids = load_tokenizer(MODEL)(text, add_special_tokens=False)["input_ids"]
    by_text = client.completions.create(model=MODEL, prompt=text, max_tokens=1, logprobs=1, echo=True, temperature=0)
    for prompt in (ids, [ids]):
        by_ids = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, logprobs=1, echo=True,
                                           temperature=0)
        assert by_ids.choices[0].text == by_text.choices[0].text and by_ids.choices[0].text.startswith(text)
        assert by_ids.choices[0].logprobs.tokens == by_text.choices[0].logprobs.tokens
        assert by_ids.choices[0].logprobs.token_logprobs == pytest.approx(by_text.choices[0].logprobs.token_logprobs,
                                                                         abs=1e-4)
        assert by_ids.usage.prompt_tokens == len(ids)


def test_lm_eval_through_the_edge_scores_what_lm_evals_hf_model_scores(
        edge: dict, kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SPECSTREAM_CONFIG", "/dev/null")
    monkeypatch.setenv("SPECSTREAM_ENGINE__MAX_MODEL_LEN", str(MAX_MODEL_LEN))  # the shared worker's context
    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.setenv(name, "1")
    status = main(["eval", "run", "--lm-eval", "--hf", "--base-url", edge["base_url"], "--api-key", edge["key"],
                   "--concurrency", "4", "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert status == 0, f"{out}\n{err[-3000:]}"
    report = json.loads((tmp_path / "lm_eval.json").read_text())
    rows = {(r["task"], r["metric"]): r for r in report["comparison"]}
    assert {("specstream_mc", "acc,none"), ("specstream_mc", "acc_norm,none"),
            ("specstream_gen", "exact_match,last_word")} <= set(rows), rows
    for row in rows.values():
        assert row["agrees"] and row["hf"] is not None, row
    # Not a vacuous agreement: the model gets some right and some wrong.
    assert 0 < rows[("specstream_mc", "acc,none")]["ours"] < 1
    assert 0 < rows[("specstream_gen", "exact_match,last_word")]["ours"] < 1
    assert "## comparison" in out and "| specstream_mc |" in out
    assert edge["key"] not in out + err + (tmp_path / "lm_eval.json").read_text()  # the key is never recorded

    # local-completions sent its log-likelihood prompts as token ids (its default), not text.
    assert any(r.prompt_token_ids is not None and r.echo and r.prompt for r in _requests(kafka_bootstrap, edge["prefix"]))


def _requests(bootstrap: str, prefix: str) -> list[GenerateRequest]:
    out = []
    for raw in asyncio.run(request_topic_messages(bootstrap, prefix)):
        try:
            out.append(GenerateRequest.model_validate_json(raw))
        except ValidationError:  # another test's deliberately odd message, or not a request
            continue
    return out
