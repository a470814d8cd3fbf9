"""The services ``specstream up`` started, kept running: one that dies is restarted with backoff, and logged.

Each service is a child process of its own (``python -m streams.cli worker``,
``... edge``) in its own process group, so the terminal's Ctrl-C reaches only
``up``, which then stops the children in order. :class:`Supervisor` is polled
by ``up``'s main loop (:meth:`Supervisor.check`); it never blocks.

Restarts follow :class:`RestartPolicy` (``ops.restart`` in the configuration): the first restart comes after
``first_backoff_s``, and each further death in a row doubles the wait, up to
``max_backoff_s``. A child that ran ``healthy_after_s`` before it died starts a
new series (its next restart comes after ``first_backoff_s`` again). A child
that died ``crash_loop_after`` times in a row, each before it ran healthy, is
crash-looping: restarting it again would not help (a bad model path, a port
that is taken), so :meth:`Supervisor.check` raises :class:`CrashLoop` instead,
and ``up`` says so and stops. Once :meth:`Supervisor.stop` began, nothing is
restarted.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

STOP_TIMEOUT_S = 45.0  # a draining worker finishes what it holds (worker.drain_timeout_s, 30 s) within this


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class RestartPolicy:
    """Defaults and meaning: ``ops.restart`` in the configuration (streams.config.ops.RestartSettings)."""

    first_backoff_s: float = 1.0
    max_backoff_s: float = 15.0
    healthy_after_s: float = 60.0
    crash_loop_after: int = 6

    def backoff_s(self, deaths_in_a_row: int) -> float:
        """Seconds to wait before restarting a child that just died for the n-th time in a row (n >= 1)."""
        return min(self.max_backoff_s, self.first_backoff_s * 2 ** max(0, deaths_in_a_row - 1))


class CrashLoop(RuntimeError):
    """A child kept dying soon after it started; it is not restarted again."""


def exit_description(returncode: int) -> str:
    """``exited with status 1`` or ``killed by SIGKILL`` (Popen reports death by signal N as -N)."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"


@dataclass
class Child:
    name: str
    argv: list[str]
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0  # clock() of the current process's start
    deaths_in_a_row: int = 0  # each before it ran healthy_after_s
    restarts: int = 0
    restart_at: float | None = None  # set while waiting out a backoff

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class Supervisor:
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    say: Callable[[str], None] = _say
    clock: Callable[[], float] = time.monotonic
    stop_timeout_s: float = STOP_TIMEOUT_S
    children: list[Child] = field(default_factory=list)
    stopping: bool = False

    def start(self, name: str, argv: list[str]) -> Child:
        child = Child(name, list(argv))
        self.children.append(child)
        self._launch(child)
        self.say(f"{name}: started (pid {child.pid})")
        return child

    def _launch(self, child: Child) -> None:
        # Own session and process group: the terminal's Ctrl-C reaches only `up`, which stops children in order.
        child.process = subprocess.Popen(child.argv, start_new_session=True, stdin=subprocess.DEVNULL)
        child.started_at = self.clock()
        child.restart_at = None

    def check(self) -> None:
        """Restart the children whose backoff is over; note the ones that died. Raises CrashLoop (see the module)."""
        if self.stopping:
            return
        now = self.clock()
        for child in self.children:
            if child.restart_at is not None:
                if now >= child.restart_at:
                    self._launch(child)
                    child.restarts += 1
                    self.say(f"{child.name}: restarted (pid {child.pid}, restart {child.restarts})")
                continue
            assert child.process is not None
            code = child.process.poll()
            if code is not None:
                self._died(child, code, now)

    def _died(self, child: Child, code: int, now: float) -> None:
        ran_s = now - child.started_at
        quick = ran_s < self.policy.healthy_after_s
        child.deaths_in_a_row = child.deaths_in_a_row + 1 if quick else 1
        what = f"{exit_description(code)} after {ran_s:.1f}s"
        if child.deaths_in_a_row >= self.policy.crash_loop_after:
            raise CrashLoop(
                f"{child.name} is crash-looping: it died {child.deaths_in_a_row} times in a row, each within "
                f"{self.policy.healthy_after_s:g}s of starting (last: {what}); not restarting it")
        delay = self.policy.backoff_s(child.deaths_in_a_row)
        child.restart_at = now + delay
        self.say(f"{child.name} (pid {child.pid}): {what}; restarting in {delay:g}s")

    def stop(self) -> None:
        """Stop every child, the last started first: SIGTERM its process group and wait for it to exit.

        After ``stop_timeout_s`` in all, or a second Ctrl-C, what is left is killed.
        Nothing is restarted from here on.
        """
        self.stopping = True
        deadline = self.clock() + self.stop_timeout_s
        order = [c for c in reversed(self.children) if c.process is not None]
        try:
            for child in order:
                self._stop_one(child, deadline)
        except KeyboardInterrupt:
            for child in order:
                if child.alive():
                    self._kill(child, "killed (interrupted again)")

    def _stop_one(self, child: Child, deadline: float) -> None:
        assert child.process is not None
        if child.restart_at is not None or child.process.poll() is not None:
            return  # already dead: nothing to stop (and no restart, since stopping is set)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.process.pid, signal.SIGTERM)
        try:
            child.process.wait(max(0.1, deadline - self.clock()))
            self.say(f"{child.name}: stopped")
        except subprocess.TimeoutExpired:
            self._kill(child, f"killed after {self.stop_timeout_s:.0f}s")

    def _kill(self, child: Child, why: str) -> None:
        assert child.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.process.pid, signal.SIGKILL)
        child.process.wait()
        self.say(f"{child.name}: {why}")


def service_argv(config: str | None, command: str) -> list[str]:
    """The command line of one service: what the ``specstream`` script runs, with the same configuration."""
    argv = [sys.executable, "-m", "streams.cli"]
    if config:
        argv += ["--config", config]
    return [*argv, command]
