"""Engine workers on this machine, started and drained to a replica count (what a Deployment is to KEDA).

Each worker is ``python -m streams.cli [--config FILE] worker`` in its own session (so a Ctrl-C at the terminal
reaches only the autoscaler), with ``worker.id`` set to ``<prefix>-<n>`` so its announcements and logs say which
one it is. Scaling down drains the newest worker: SIGTERM makes it announce ``draining``, stop reading, finish what
it holds (``worker.drain_timeout_s``), commit, announce ``stopped``, leave the group and exit 0. A draining worker no
longer counts as a replica; it is reaped when it exits. A serving worker that exits by itself is reported and no
longer counted, so the next decision starts another one.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from streams.supervisor import exit_description


@dataclass
class LocalWorker:
    worker_id: str
    process: subprocess.Popen[bytes]
    started_at: float
    drain_started_at: float | None = None

    @property
    def pid(self) -> int:
        return self.process.pid


@dataclass
class LocalFleet:
    argv: list[str]  # the worker's command line
    say: Callable[[str], None]
    id_prefix: str = f"autoscale-{os.getpid()}"
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    log_dir: Path | None = None  # each worker's output in <log_dir>/<worker_id>.log; None: this terminal
    serving: list[LocalWorker] = field(default_factory=list)
    draining: list[LocalWorker] = field(default_factory=list)
    _started: int = 0

    @property
    def size(self) -> int:
        """Replicas that count: started and not draining (a starting worker counts, as a starting pod does)."""
        return len(self.serving)

    def scale_to(self, replicas: int) -> None:
        while self.size < replicas:
            self._start()
        while self.size > replicas:
            self._drain(self.serving.pop())  # the newest: the one with the least work and the least warm cache

    def reap(self) -> None:
        """Note the workers that exited since the last call."""
        now = time.monotonic()
        for worker in [w for w in self.serving if w.process.poll() is not None]:
            self.serving.remove(worker)
            self.say(f"{worker.worker_id} (pid {worker.pid}) {exit_description(worker.process.returncode)} after "
                     f"{now - worker.started_at:.1f} s while serving; not counted any more")
        for worker in [w for w in self.draining if w.process.poll() is not None]:
            self.draining.remove(worker)
            assert worker.drain_started_at is not None
            self.say(f"{worker.worker_id} (pid {worker.pid}) drained: {exit_description(worker.process.returncode)} "
                     f"{now - worker.drain_started_at:.1f} s after SIGTERM")

    def stop_all(self, timeout_s: float) -> None:
        """Drain every worker and wait for them; what is left after timeout_s is killed."""
        while self.serving:
            self._drain(self.serving.pop())
        deadline = time.monotonic() + timeout_s
        for worker in list(self.draining):
            try:
                worker.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(worker.pid, signal.SIGKILL)
                worker.process.wait()
                self.say(f"{worker.worker_id} (pid {worker.pid}) killed: not drained within {timeout_s:g} s")
        self.reap()

    def _start(self) -> None:
        self._started += 1
        worker_id = f"{self.id_prefix}-{self._started}"
        env = {**self.env, "SPECSTREAM_WORKER__ID": worker_id}
        output: IO[bytes] | None = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            output = open(self.log_dir / f"{worker_id}.log", "ab")  # noqa: SIM115 - the child owns it from here
        try:
            process = subprocess.Popen(self.argv, env=env, start_new_session=True, stdin=subprocess.DEVNULL,
                                       stdout=output, stderr=subprocess.STDOUT if output else None)
        finally:
            if output is not None:
                output.close()
        self.serving.append(LocalWorker(worker_id, process, time.monotonic()))
        self.say(f"{worker_id}: started (pid {process.pid})")

    def _drain(self, worker: LocalWorker) -> None:
        worker.drain_started_at = time.monotonic()
        self.draining.append(worker)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGTERM)
        self.say(f"{worker.worker_id} (pid {worker.pid}): draining (SIGTERM: finish, commit, leave)")
