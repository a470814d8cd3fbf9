"""`specstream eval` says precisely why it cannot evaluate, with an exit status a rollout can tell from a failed gate."""
from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from streams.cli import main


@pytest.fixture(autouse=True)
def _own_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECSTREAM_CONFIG", "/dev/null")
    monkeypatch.setenv("SPECSTREAM_KAFKA__TOPIC_PREFIX", f"evalcli-{uuid.uuid4().hex[:8]}")


def test_a_bad_candidate_configuration_exits_2_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    candidate = tmp_path / "candidate.yaml"
    candidate.write_text("eval:\n  candidate_sampling:\n    max_tokens_cap: 0\n")
    assert main(["eval", "replay", "--since", "1h", "--candidate", str(candidate)]) == 2
    assert "config error: eval.candidate_sampling.max_tokens_cap: Input should be greater than or equal to 1" in \
        capsys.readouterr().err


def test_a_bad_samples_file_exits_3_naming_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    samples = tmp_path / "samples.jsonl"
    samples.write_text('{"input": "Hi"}\n{"input": 3}\n')
    assert main(["eval", "run", "--samples", str(samples)]) == 3
    assert "samples.jsonl line 2: messages.0.content: Input should be a valid string" in capsys.readouterr().err


def test_a_gate_threshold_that_is_no_number_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["eval", "replay", "--since", "1h", "--target-prefix", "p", "--min-exact-match", "most"])
    assert exit_.value.code == 2
    assert "expected a number or a percentage such as 10%, got 'most'" in capsys.readouterr().err
