"""Broker JVM processes: launch detached, find by pid file, signal, reap.

Brokers are launched through a throw-away ``sh`` that backgrounds the JVM and
exits at once. The JVM therefore is never our child (init reaps it, so a stopped
broker never lingers as a zombie that still "exists" to ``kill -0``) and lives in
its own session, so Ctrl-C in the terminal or a pytest interrupt does not reach it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from infra.kafka.errors import BrokerStartError
from infra.kafka.java import JavaRuntime
from infra.kafka.paths import LOG4J2_CONFIG
from infra.kafka.spec import KafkaNodeSpec

BROKER_MAIN_CLASS = "kafka.Kafka"
_POLL_S = 0.1
# Sends the JVM's output to $1, runs the rest of the arguments in the background
# and prints the background pid.
_LAUNCHER = 'log="$1"; shift; "$@" >"$log" 2>&1 </dev/null & echo $!'


def jvm_command(node: KafkaNodeSpec, java: JavaRuntime, libs: Path) -> list[str]:
    return [
        str(java.executable),
        f"-Xms{min(128, node.heap_mb)}m",
        f"-Xmx{node.heap_mb}m",
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-XX:InitiatingHeapOccupancyPercent=35",
        "-XX:+ExplicitGCInvokesConcurrent",
        # A broker that ran out of heap is useless; dying makes status/wait notice.
        "-XX:+ExitOnOutOfMemoryError",
        "-Djava.awt.headless=true",
        f"-Dkafka.logs.dir={node.logs_dir}",
        f"-Dlog4j2.configurationFile={LOG4J2_CONFIG}",
        "-cp",
        f"{libs}/*",
        BROKER_MAIN_CLASS,
        str(node.config_file),
    ]


def launch(node: KafkaNodeSpec, java: JavaRuntime, libs: Path) -> int:
    """Start the node's JVM detached; write and return its pid."""
    node.logs_dir.mkdir(parents=True, exist_ok=True)
    if node.console_log.exists():
        # Keep the previous run's output (often the reason for this restart).
        node.console_log.replace(node.console_log.with_suffix(".log.prev"))
    command = ["sh", "-c", _LAUNCHER, "kafka-launch", str(node.console_log), *jvm_command(node, java, libs)]
    try:
        completed = subprocess.run(
            command, capture_output=True, text=True, timeout=30, check=False, start_new_session=True
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise BrokerStartError(f"cannot launch node {node.node_id}: {error}") from error
    pid_text = completed.stdout.strip()
    if completed.returncode != 0 or not pid_text.isdigit():
        raise BrokerStartError(f"cannot launch node {node.node_id}: {completed.stderr.strip() or pid_text!r}")
    pid = int(pid_text)
    node.pid_file.write_text(f"{pid}\n")
    return pid


def _read_pid(node: KafkaNodeSpec) -> int | None:
    try:
        text = node.pid_file.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _cmdline(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return _cmdline_from_ps(pid)
    return raw.replace(b"\0", b" ").decode(errors="replace")


def _cmdline_from_ps(pid: int) -> str | None:
    # No /proc (macOS): ps is slower but works everywhere.
    try:
        completed = subprocess.run(
            ["ps", "-p", str(pid), "-o", "command="], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return completed.stdout.strip() or None


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # Field 3, after the parenthesised command name (which may contain spaces).
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


# A process in the middle of an exec (launch's sh becoming the JVM) reads an empty command line for a moment: read
# again before saying it is not the broker, which would drop the pid file of a broker that is starting.
_EXEC_READS = 10
_EXEC_WAIT_S = 0.02


def is_node_process(pid: int, node: KafkaNodeSpec) -> bool:
    """True if ``pid`` is alive and is this node's broker (not a recycled pid)."""
    for _ in range(_EXEC_READS):
        if _is_zombie(pid):
            return False
        cmdline = _cmdline(pid)
        if cmdline is None:
            return False
        if cmdline.strip():
            return BROKER_MAIN_CLASS in cmdline and str(node.config_file) in cmdline
        time.sleep(_EXEC_WAIT_S)
    return False  # still empty: a kernel thread on a recycled pid


def running_pid(node: KafkaNodeSpec) -> int | None:
    """The node's live broker pid; a stale pid file is removed on the way."""
    pid = _read_pid(node)
    if pid is None:
        node.pid_file.unlink(missing_ok=True)
        return None
    if is_node_process(pid, node):
        return pid
    node.pid_file.unlink(missing_ok=True)
    return None


def find_untracked_pid(node: KafkaNodeSpec) -> int | None:
    """A broker for this node's config that runs without a pid file (e.g. file deleted)."""
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    for entry in proc.iterdir():
        if entry.name.isdigit() and is_node_process(int(entry.name), node):
            return int(entry.name)
    return None


def port_open(host: str, port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def send_signal(pid: int, sig: signal.Signals) -> bool:
    """Signal ``pid``; False when it is already gone."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


def wait_exit(pid: int, node: KafkaNodeSpec, timeout_s: float) -> bool:
    """Wait until the node's process is gone; True if it exited in time."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not is_node_process(pid, node):
            return True
        time.sleep(_POLL_S)
    return not is_node_process(pid, node)


def _interesting_lines(text: str, count: int) -> list[str]:
    lines = text.strip().splitlines()
    errors = [line for line in lines[-300:] if " ERROR " in line or " FATAL " in line or "Exception" in line]
    return (errors or lines)[-count:]


def log_tail(node: KafkaNodeSpec, lines: int = 3) -> str:
    """Why a JVM died, in one line: console output (JVM errors) else server.log errors."""
    for path in (node.console_log, node.server_log):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        if text.strip():
            return f"{path}: " + " | ".join(_interesting_lines(text, lines))
    return f"no output in {node.logs_dir}"
