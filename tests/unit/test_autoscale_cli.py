"""`specstream autoscale`'s command line: KEDA rendering from the same flags, and refusals of nonsense."""
from __future__ import annotations

import pytest
import yaml

from streams.cli import main


def test_render_keda_prints_the_scaled_object_of_the_flags_and_the_configured_topic_and_group(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECSTREAM_CONFIG", "/dev/null")
    monkeypatch.setenv("SPECSTREAM_KAFKA__TOPIC_PREFIX", "prod")
    monkeypatch.setenv("SPECSTREAM_KAFKA__BOOTSTRAP_SERVERS", "kafka-bootstrap:9092")
    assert main(["autoscale", "--min", "0", "--max", "8", "--lag-threshold", "12", "--activation-lag-threshold", "2",
                 "--render-keda", "--namespace", "llm"]) == 0
    obj = yaml.safe_load(capsys.readouterr().out)
    assert obj["kind"] == "ScaledObject" and obj["metadata"] == {"name": "specstream-worker", "namespace": "llm"}
    assert (obj["spec"]["minReplicaCount"], obj["spec"]["maxReplicaCount"]) == (0, 8)
    meta = obj["spec"]["triggers"][0]["metadata"]
    assert (meta["topic"], meta["consumerGroup"], meta["bootstrapServers"]) == (
        "prod.requests", "prod.engine-workers", "kafka-bootstrap:9092")
    assert (meta["lagThreshold"], meta["activationLagThreshold"]) == ("12", "2")


@pytest.mark.parametrize(("flags", "message"), [
    (["--min", "3", "--max", "2"], "need 0 <= min (3) <= max (2)"),
    (["--lag-threshold", "0"], "lag_threshold must be positive"),
    (["--interval", "0"], "--interval must be positive"),
])
def test_a_policy_that_cannot_work_exits_2_with_one_line(flags: list[str], message: str,
                                                         capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECSTREAM_CONFIG", "/dev/null")
    assert main(["autoscale", *flags]) == 2
    assert message in capsys.readouterr().err
