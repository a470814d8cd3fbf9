"""eval replay on the real broker: a deployment that recorded nothing exits 3 naming its completions topic."""
from __future__ import annotations

import uuid

import pytest

from streams.cli import main
from tests.kafka_fixtures import kafka_bootstrap, kafka_single  # noqa: F401


@pytest.mark.kafka
def test_replaying_a_deployment_that_recorded_nothing_exits_3_naming_the_topic(
        kafka_bootstrap: str,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SPECSTREAM_KAFKA__BOOTSTRAP_SERVERS", kafka_bootstrap)
    # A prefix of its own: other tests' deployments on this broker did record completions.
    prefix = f"norecord{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("SPECSTREAM_KAFKA__TOPIC_PREFIX", prefix)
    assert main(["eval", "replay", "--since", "2h", "--target-prefix", "p"]) == 3
    assert f"{prefix}.completions does not exist" in capsys.readouterr().err
