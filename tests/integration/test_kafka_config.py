"""Fast checks of the Kafka tooling that need no JVM: specs, properties, version parsing, jar cache."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from infra.kafka import jars
from infra.kafka.cli import main
from infra.kafka.errors import JavaError
from infra.kafka.java import parse_major
from infra.kafka.properties import server_properties
from infra.kafka.spec import single_node, three_nodes
from infra.kafka.storage import random_kafka_uuid


@pytest.mark.parametrize(
    ("output", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('openjdk version "21" 2023-09-19', 21),
        ('java version "1.8.0_402"', 8),
        ('openjdk version "11.0.2-ea" 2019-01-15', 11),
    ],
)
def test_the_java_major_version_is_read_from_old_and_new_version_strings(output: str, major: int) -> None:
    assert parse_major(output) == major


def test_parse_java_major_rejects_garbage() -> None:
    with pytest.raises(JavaError, match="cannot read the Java version"):
        parse_major("command not found")


def test_a_single_node_listens_on_its_port_and_the_next_with_replication_1_and_no_auto_create(tmp_path: Path) -> None:
    spec = single_node(port=9092, state_dir=tmp_path)
    (node,) = spec.nodes
    settings = server_properties(spec, node)
    assert (node.broker_port, node.controller_port) == (9092, 9093)
    assert settings["listeners"] == "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"
    assert settings["controller.quorum.bootstrap.servers"] == "127.0.0.1:9093"
    for key in (
        "default.replication.factor",
        "min.insync.replicas",
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
    ):
        assert settings[key] == "1", key
    assert settings["group.initial.rebalance.delay.ms"] == "0"
    assert settings["auto.create.topics.enable"] == "false"


def test_three_nodes_take_consecutive_port_pairs_with_replication_3_and_min_isr_2(tmp_path: Path) -> None:
    spec = three_nodes(base_port=39092, state_dir=tmp_path)
    ports = [(node.broker_port, node.controller_port) for node in spec.nodes]
    assert ports == [(39092, 39093), (39094, 39095), (39096, 39097)]
    assert spec.bootstrap_servers == "127.0.0.1:39092,127.0.0.1:39094,127.0.0.1:39096"
    assert len({node.state_dir for node in spec.nodes}) == 3
    settings = server_properties(spec, spec.node(2))
    assert settings["node.id"] == "2"
    assert settings["controller.quorum.bootstrap.servers"] == "127.0.0.1:39093,127.0.0.1:39095,127.0.0.1:39097"
    assert settings["default.replication.factor"] == "3"
    assert settings["offsets.topic.replication.factor"] == "3"
    assert settings["min.insync.replicas"] == "2"
    assert settings["transaction.state.log.min.isr"] == "2"


def test_extra_properties_and_auto_create_override_the_defaults(tmp_path: Path) -> None:
    spec = single_node(state_dir=tmp_path, auto_create_topics=True, extra_properties={"num.partitions": "6"})
    settings = server_properties(spec, spec.nodes[0])
    assert settings["auto.create.topics.enable"] == "true"
    assert settings["num.partitions"] == "6"


def test_state_folders_default_under_the_state_dir_named_by_port(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECSTREAM_STATE_DIR", str(tmp_path))
    assert single_node().state_dir == tmp_path / "kafka-single"
    assert single_node(port=49092).state_dir == tmp_path / "kafka-single-49092"
    assert [node.state_dir for node in three_nodes().nodes] == [
        tmp_path / "kafka-cluster-29192" / f"node-{node_id}" for node_id in (1, 2, 3)
    ]
    assert three_nodes(base_port=41000).state_dir == tmp_path / "kafka-cluster-41000"


def test_spec_rejects_bad_ports(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="must differ"):
        single_node(port=9092, controller_port=9092, state_dir=tmp_path)
    with pytest.raises(ValueError, match="outside"):
        three_nodes(base_port=65534, state_dir=tmp_path)
    with pytest.raises(KeyError, match="no node 4"):
        three_nodes(state_dir=tmp_path).node(4)


def test_cluster_ids_are_distinct_22_character_kafka_uuids() -> None:
    ids = {random_kafka_uuid() for _ in range(200)}
    assert len(ids) == 200
    assert all(re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_-]{21}", value) for value in ids)


def test_jar_cache_needs_marker_and_every_jar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECSTREAM_CACHE_DIR", str(tmp_path))
    libs = jars.libs_dir("9.9.9")
    assert libs == tmp_path / "kafka" / "9.9.9" / "libs"
    libs.mkdir(parents=True)
    (libs / "a.jar").write_bytes(b"")
    assert not jars.is_resolved("9.9.9")  # no marker: an interrupted copy
    (libs.parent / jars.MARKER_NAME).write_text(json.dumps({"jars": ["a.jar", "b.jar"]}))
    assert not jars.is_resolved("9.9.9")  # b.jar went missing
    (libs / "b.jar").write_bytes(b"")
    assert jars.is_resolved("9.9.9")
    assert jars.ensure_kafka_jars("9.9.9") == libs  # complete: Maven is not run


def test_cli_reports_a_stopped_deployment_as_not_running(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--port", "45991", "--state-dir", str(tmp_path)]) == 1
    assert capsys.readouterr().out.strip() == "kafka single: not running"
    assert main(["stop", "--cluster", "--port", "45981", "--state-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == "kafka cluster: not running"
