"""The supervisor of `specstream up`, on real child processes (small Python programs instead of the services)."""
from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from streams.supervisor import CrashLoop, RestartPolicy, Supervisor, exit_description

QUICK = RestartPolicy(first_backoff_s=0.05, max_backoff_s=0.2, healthy_after_s=30.0, crash_loop_after=3)


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def poll_until(supervisor: Supervisor, done: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "timed out"
        supervisor.check()
        time.sleep(0.02)


def wait_for_file(path: Path, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def test_backoff_doubles_with_each_death_in_a_row_up_to_its_cap() -> None:
    policy = RestartPolicy(first_backoff_s=1.0, max_backoff_s=15.0)
    assert [policy.backoff_s(n) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 15.0, 15.0]


def test_a_death_is_described_by_its_exit_status_or_its_signal() -> None:
    assert exit_description(3) == "exited with status 3"
    assert exit_description(0) == "exited with status 0"
    assert exit_description(-9) == "killed by SIGKILL"


def test_a_child_killed_with_sigkill_is_restarted_and_both_are_logged() -> None:
    said: list[str] = []
    supervisor = Supervisor(policy=QUICK, say=said.append)
    child = supervisor.start("worker", python("import time; time.sleep(120)"))
    first_pid = child.pid
    assert first_pid is not None
    try:
        os.kill(first_pid, signal.SIGKILL)
        poll_until(supervisor, lambda: child.restarts == 1)
        assert child.pid != first_pid and child.alive()
        assert f"worker (pid {first_pid}): killed by SIGKILL after" in said[1] and "restarting in 0.05s" in said[1]
        assert said[2] == f"worker: restarted (pid {child.pid}, restart 1)"
    finally:
        supervisor.stop()
    assert not child.alive()


def test_a_child_that_keeps_dying_at_start_is_reported_as_crash_looping_instead_of_restarted() -> None:
    said: list[str] = []
    supervisor = Supervisor(policy=QUICK, say=said.append)
    child = supervisor.start("edge", python("import sys; sys.exit(3)"))
    with pytest.raises(CrashLoop) as raised:
        poll_until(supervisor, lambda: False)
    message = str(raised.value)
    assert message.startswith("edge is crash-looping: it died 3 times in a row, each within 30s of starting")
    assert "last: exited with status 3" in message and message.endswith("not restarting it")
    assert child.restarts == 2  # started once, restarted twice, then given up
    waits = [line.split("restarting in ")[1] for line in said if "restarting in" in line]
    assert waits == ["0.05s", "0.1s"]  # the backoff doubled between the two restarts
    supervisor.stop()


def test_a_child_that_ran_healthy_before_dying_starts_a_new_series_of_restarts() -> None:
    said: list[str] = []
    healthy_soon = RestartPolicy(first_backoff_s=0.05, max_backoff_s=0.2, healthy_after_s=0.3, crash_loop_after=2)
    supervisor = Supervisor(policy=healthy_soon, say=said.append)
    child = supervisor.start("worker", python("import time; time.sleep(0.6)"))
    try:
        poll_until(supervisor, lambda: child.restarts == 3)  # crash_loop_after=2 would have stopped quick deaths
        waits = [line.split("restarting in ")[1] for line in said if "restarting in" in line]
        assert waits == ["0.05s"] * 3 and child.deaths_in_a_row == 1
    finally:
        supervisor.stop()


def test_stop_terminates_the_last_started_child_first_and_restarts_nothing_afterwards() -> None:
    said: list[str] = []
    supervisor = Supervisor(policy=QUICK, say=said.append)
    first = supervisor.start("worker", python("import time; time.sleep(120)"))
    second = supervisor.start("edge", python("import time; time.sleep(120)"))
    supervisor.stop()
    assert said[-2:] == ["edge: stopped", "worker: stopped"]
    assert first.process is not None and first.process.returncode == -signal.SIGTERM
    assert second.process is not None and second.process.returncode == -signal.SIGTERM
    supervisor.check()
    time.sleep(0.1)
    supervisor.check()
    assert first.restarts == second.restarts == 0 and not first.alive() and not second.alive()


def test_stop_kills_a_child_that_ignores_sigterm_after_the_stop_timeout(tmp_path: Path) -> None:
    said: list[str] = []
    marker = tmp_path / "ignoring"
    supervisor = Supervisor(policy=QUICK, say=said.append, stop_timeout_s=1.0)
    child = supervisor.start("worker", python(
        "import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "pathlib.Path(sys.argv[1]).touch(); time.sleep(120)") + [str(marker)])
    wait_for_file(marker)
    started = time.monotonic()
    supervisor.stop()
    assert 0.9 <= time.monotonic() - started < 10
    assert said[-1] == "worker: killed after 1s"
    assert child.process is not None and child.process.returncode == -signal.SIGKILL


def test_the_shipped_restart_settings_are_the_policy_a_bare_supervisor_uses() -> None:
    from streams.config.ops import RestartSettings

    assert RestartPolicy(**RestartSettings().model_dump()) == RestartPolicy()
