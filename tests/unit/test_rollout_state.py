"""`rollout start` refuses a bad candidate file naming its key (the rollouts topic itself, on the real broker:
tests/integration/test_rollout_state_bus.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from streams.cli import main


def test_a_candidate_file_with_an_unknown_key_exits_2_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECSTREAM_CONFIG", "/dev/null")
    candidate = tmp_path / "candidate.yaml"
    candidate.write_text("engine:\n  max_modl_len: 64\n")
    assert main(["rollout", "start", "--candidate", str(candidate)]) == 2
    assert "engine.max_modl_len" in capsys.readouterr().err
