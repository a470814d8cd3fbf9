"""Which process is a Kafka node's broker: a live process whose command line names the broker's main class and the
node's config, even read in the middle of the launcher's exec into the JVM; never a recycled pid."""
from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.kafka import process
from infra.kafka.spec import KafkaNodeSpec


@pytest.fixture
def node(tmp_path: Path) -> KafkaNodeSpec:
    return KafkaNodeSpec(node_id=1, broker_port=1, controller_port=2, state_dir=tmp_path / "node-1", heap_mb=128)


@pytest.fixture
def broker_like(node: KafkaNodeSpec) -> Iterator[int]:
    """A live process whose command line reads like the node's JVM."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", process.BROKER_MAIN_CLASS,
                              str(node.config_file)])  # fmt: skip
    yield child.pid
    child.kill()
    child.wait()


def test_a_live_process_naming_the_nodes_broker_is_it_and_others_are_not(
        node: KafkaNodeSpec, broker_like: int, tmp_path: Path) -> None:
    assert process.is_node_process(broker_like, node)
    other = KafkaNodeSpec(node_id=2, broker_port=3, controller_port=4, state_dir=tmp_path / "node-2", heap_mb=128)
    assert not process.is_node_process(broker_like, other)
    assert not process.is_node_process(2, node)  # kthreadd: alive, its command line always empty


def test_a_command_line_read_empty_mid_exec_keeps_a_starting_brokers_pid_file(
        node: KafkaNodeSpec, broker_like: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Reading /proc/<pid>/cmdline while the launcher's sh execs the JVM can give "": that once dropped the pid file
    # of a broker that was starting, and the restart was reported as "exited while starting" (a chaos run's).
    real, empty_reads = process._cmdline, ["", ""]

    def mid_exec(pid: int) -> str | None:
        return empty_reads.pop() if empty_reads else real(pid)

    monkeypatch.setattr(process, "_cmdline", mid_exec)
    node.state_dir.mkdir(parents=True)
    node.pid_file.write_text(f"{broker_like}\n")
    assert process.running_pid(node) == broker_like and node.pid_file.exists()


def test_a_dead_pid_is_not_the_broker_and_its_stale_pid_file_goes(node: KafkaNodeSpec, broker_like: int) -> None:
    subprocess.run(["kill", "-9", str(broker_like)], check=True)
    node.state_dir.mkdir(parents=True)
    node.pid_file.write_text(f"{broker_like}\n")
    for _ in range(100):  # until the kill lands: a zombie until the fixture reaps it, which is not the broker
        if process.running_pid(node) is None:
            break
        time.sleep(0.05)
    assert process.running_pid(node) is None and not node.pid_file.exists()
