"""Where a vLLM-backed worker runs, and that its spawned children die with it (streams.commands.vllm_env)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streams.commands import vllm_env

_PARENT = """
import multiprocessing, sys, time
from streams.commands.vllm_env import die_with_parent

def child(guard, running):
    if guard:
        die_with_parent()
    running.set()
    time.sleep(60)

if __name__ == "__main__":
    spawn = multiprocessing.get_context("spawn")
    running = spawn.Event()
    process = spawn.Process(target=child, args=(sys.argv[1] == "guard", running))
    process.start()
    running.wait(30)
    print(process.pid, flush=True)
    time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead too: it only waits for its (new) parent to reap it.
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


@pytest.mark.parametrize("guarded", [True, False])
def test_a_spawned_child_dies_with_its_parent_killed_with_9_only_when_guarded(tmp_path: Path, guarded: bool) -> None:
    script = tmp_path / "parent.py"
    script.write_text(_PARENT)
    parent = subprocess.Popen([sys.executable, str(script), "guard" if guarded else "bare"], stdout=subprocess.PIPE,
                              text=True, cwd=Path(__file__).resolve().parents[2])
    child = int(parent.stdout.readline())
    try:
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 5
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _alive(child) is not guarded
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)


def test_without_vllm_here_or_its_environment_the_worker_exits_1_naming_the_set_up(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SPECSTREAM_VLLM_PYTHON", str(tmp_path / "missing" / "python"))
    monkeypatch.setattr(vllm_env.importlib.util, "find_spec", lambda name: None)
    said: list[str] = []
    with pytest.raises(SystemExit) as exited:
        vllm_env.move_to_vllm_environment(said.append)
    assert exited.value.code == 1 and "./dev setup vllm" in said[0] and "missing" in said[0]
