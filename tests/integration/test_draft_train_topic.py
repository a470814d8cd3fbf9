"""`specstream draft train --from-topic completions` on the real broker: records published to a fresh
completions topic become training sequences (records without their prompt are skipped), and the run writes a
head that loads for its target and is refused by another."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from streams.cli import main
from tests.completion_records import publish, record
from tests.kafka_fixtures import kafka_bootstrap, kafka_single, unique_topic  # noqa: F401
from tests.tiny_targets import tiny_chat_target

pytestmark = [pytest.mark.kafka, pytest.mark.model, pytest.mark.timeout(600)]

ANSWERS = {
    "What is Kafka?": "Kafka is a distributed log that keeps records in order.",
    "Name three colours.": "Red, green and blue.",
    "Why walk in the countryside?": "Fresh air, quiet, and the pleasure of moving at your own pace.",
}


def _record(i: int, question: str, answer: str, log_prompt: bool = True) -> Any:
    return record(f"r{i}", question, answer, log_prompt=log_prompt)


def test_draft_train_reads_the_completions_topic_and_writes_a_head_for_its_target(
    kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]  # noqa: F811
) -> None:
    prefix = unique_topic("draft")
    records = [_record(i, q, a) for i, (q, a) in enumerate(ANSWERS.items())]
    records.append(_record(9, "a private question", "a private answer", log_prompt=False))  # tenant opted out
    asyncio.run(publish(kafka_bootstrap, f"{prefix}.completions", records))
    target = tiny_chat_target(tmp_path / "target", seed=0)
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({"kafka": {"bootstrap_servers": kafka_bootstrap, "topic_prefix": prefix},
                                  "engine": {"model": str(target), "max_model_len": 256, "kv_cache_bytes": "8MiB"}}))

    code = main(["--config", str(config), "draft", "train", "--from-topic", "completions", "--samples", "10",
                 "--generate", "0", "--epochs", "1", "--name", "tiny", "--out-root", str(tmp_path / "heads")])

    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["log"]["replayable"] == 3 and report["log"]["prompt_not_logged"] == 1
    assert report["sequences"] == 3 and report["generated"] == 0
    assert len(report["acceptance_by_position"]) == 6
    head = Path(report["head"])
    assert head.parent == tmp_path / "heads" / "tiny" and (head / "head.safetensors").is_file()

    from engine.loader import load_model
    from engine.speculative.eagle_artifact import DraftHeadMismatch, load_head

    load_head(str(head.parent), load_model(str(target)).model, "tiny")  # newest version, fits its target
    other = load_model(str(tiny_chat_target(tmp_path / "other", seed=1))).model
    with pytest.raises(DraftHeadMismatch, match="was trained for"):
        load_head(str(head), other, "other")

    # A second run retrains on exactly the kept data, here with the head trained on its own rollouts.
    kept = tmp_path / "heads" / "tiny" / "sequences.json"
    code = main(["--config", str(config), "draft", "train", "--sequences", str(kept), "--rollout", "2",
                 "--epochs", "1", "--name", "tiny", "--out-root", str(tmp_path / "heads")])
    assert code == 0
    again = json.loads(capsys.readouterr().out)
    assert again["log"] == {"kept": 3} and again["sequences"] == 3 and again["generated"] == 0
    config_json = json.loads((Path(again["head"]) / "config.json").read_text())
    assert config_json["train"]["rollout"] == 2

    kept.write_text("[{\"tokens\": 5}]")
    assert main(["--config", str(config), "draft", "train", "--sequences", str(kept), "--name", "tiny",
                 "--out-root", str(tmp_path / "heads")]) == 1
    assert "not a sequences.json of draft train" in capsys.readouterr().err
