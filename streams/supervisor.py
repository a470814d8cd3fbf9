"""The child processes ``specstream up`` starts: each service is ``python -m streams.cli <command>`` of its own."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from streams.commands.common import say

STOP_TIMEOUT_S = 45.0


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]


def spawn(name: str, config: str | None, command: str) -> Child:
    argv = [sys.executable, "-m", "streams.cli"]
    if config:
        argv += ["--config", config]
    # Own process group: the terminal's Ctrl-C reaches only `up`, which then stops children in order.
    process = subprocess.Popen([*argv, command], start_new_session=True, stdin=subprocess.DEVNULL)
    say(f"{name}: started (pid {process.pid})")
    return Child(name, process)


def stop_children(children: list[Child]) -> None:
    """SIGTERM each child's process group in order and wait; SIGKILL after STOP_TIMEOUT_S or a second Ctrl-C."""
    deadline = time.monotonic() + STOP_TIMEOUT_S
    try:
        for child in children:
            if child.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.process.pid, signal.SIGTERM)
            try:
                child.process.wait(max(0.1, deadline - time.monotonic()))
                say(f"{child.name}: stopped")
            except subprocess.TimeoutExpired:
                _kill(child, f"killed after {STOP_TIMEOUT_S:.0f}s")
    except KeyboardInterrupt:
        for child in children:
            if child.process.poll() is None:
                _kill(child, "killed (interrupted again)")


def _kill(child: Child, why: str) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.process.pid, signal.SIGKILL)
    child.process.wait()
    say(f"{child.name}: {why}")
