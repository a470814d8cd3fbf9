"""Running one command in the sandbox: bubblewrap under rlimits, as an unprivileged uid, killed on the wall clock.

The command line is ``prlimit <limits> -- bwrap <view> -- <command>``, started as uid/gid ``uid_base + slot``
(one slot per concurrent call, so a fork bomb exhausts only its own process count) in a session of its own.
Output is read as it comes up to ``max_output_bytes`` (stdout and stderr together); past it, or past the wall
clock, the whole process group is killed with SIGKILL, and bubblewrap's ``--die-with-parent`` takes the pid
namespace (everything the call started) down with it.

:meth:`Sandbox.check` runs an empty call at start: where bubblewrap cannot build the sandbox (no user
namespaces, a seccomp filter refused), the runner refuses to start with that one line instead of running
tools with less isolation than documented.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from streams.config.tools import SandboxSettings, ToolSettings
from streams.tools.sandbox.reaper import become_subreaper, reap_orphans
from streams.tools.sandbox.seccomp import filter_bytes
from streams.tools.sandbox.view import bwrap_argv

_READ_CHUNK = 64 * 1024
_CHECK_TIMEOUT_S = 20.0


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot be built on this machine (one line saying why)."""


@dataclass(frozen=True)
class RunOutcome:
    stdout: str
    stderr: str
    exit_status: int | None  # the command's status; 128+N when a signal N ended it (bubblewrap's convention)
    timed_out: bool  # killed on the wall clock
    truncated: bool  # killed at the output limit; stdout/stderr hold what came before
    duration_s: float


class _Output:
    """stdout and stderr of one call, bounded together."""

    def __init__(self, limit: int, *, on_limit: Callable[[], None]) -> None:
        self.left = limit
        self.truncated = False
        self.buffers = {"stdout": bytearray(), "stderr": bytearray()}
        self._on_limit = on_limit

    def add(self, name: str, data: bytes) -> None:
        """Keep what fits; past the limit, stop the call (once) rather than at its timeout."""
        keep = data[: self.left]
        self.buffers[name] += keep
        self.left -= len(keep)
        if len(keep) < len(data) and not self.truncated:
            self.truncated = True
            self._on_limit()

    def text(self, name: str) -> str:
        return self.buffers[name].decode("utf-8", errors="replace")


class Sandbox:
    def __init__(self, settings: SandboxSettings, *, slots: int) -> None:
        self.settings = settings
        self.seccomp = filter_bytes() if settings.seccomp else None
        self._as_root = os.geteuid() == 0
        # bubblewrap's leftover processes come back to this process to be collected (streams/tools/sandbox/reaper.py).
        self._subreaper = become_subreaper()
        self._awaited: set[int] = set()  # the calls' own processes, which asyncio reaps
        # Each concurrent call gets a uid of its own (as root); otherwise they all run as this process's user.
        self._slots: asyncio.Queue[int] = asyncio.Queue()
        for slot in range(slots):
            self._slots.put_nowait(settings.uid_base + slot)

    @property
    def drops_privileges(self) -> bool:
        return self._as_root

    async def check(self) -> None:
        """Raise SandboxUnavailable (one line) unless an empty call runs in the full sandbox here."""
        s = self.settings
        missing = [tool for tool in (s.bwrap, "prlimit") if shutil.which(tool) is None]
        if missing:
            raise SandboxUnavailable(
                f"{' and '.join(missing)} not found: install bubblewrap and util-linux (apt-get install bubblewrap); "
                "tool calls are not run without the sandbox")
        if not os.path.realpath(s.python).startswith("/usr/"):
            raise SandboxUnavailable(f"tools.sandbox.python {s.python!r} is not under /usr, the only host path the "
                                     "sandbox sees")
        probe = ToolSettings(executor="python", parameters={}, timeout_s=_CHECK_TIMEOUT_S)
        outcome = await self.run([s.python, "-I", "-S", "-c", "print('ok')"], b"", probe)
        if outcome.exit_status != 0 or outcome.stdout.strip() != "ok":
            why = (outcome.stderr.strip().splitlines() or [f"exit status {outcome.exit_status}"])[-1]
            raise SandboxUnavailable(f"bubblewrap cannot build the sandbox here ({why}); tool calls are not run "
                                     "without it (see docs/tools.md)")

    async def run(self, command: list[str], stdin: bytes, limits: ToolSettings) -> RunOutcome:
        """Run ``command`` in the sandbox with ``stdin`` and the tool's limits."""
        uid = await self._slots.get()
        try:
            return await self._run(command, stdin, limits, uid)
        finally:
            self._slots.put_nowait(uid)

    async def _run(self, command: list[str], stdin: bytes, limits: ToolSettings, uid: int) -> RunOutcome:
        started = time.monotonic()
        if self._subreaper:  # also before: an orphan of an earlier call may have exited after that call's collection
            reap_orphans(self._awaited)
        read_fd: int | None = None
        if self.seccomp is not None:
            read_fd, write_fd = os.pipe()
            os.write(write_fd, self.seccomp)  # a few hundred bytes: fits the pipe's buffer
            os.close(write_fd)
        argv = [*_prlimit(limits), *bwrap_argv(self.settings.bwrap, tmp_bytes=limits.tmp_bytes, seccomp_fd=read_fd),
                "--", *command]
        identity = {"user": uid, "group": uid, "extra_groups": []} if self._as_root else {}
        try:
            process = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, start_new_session=True,
                pass_fds=(read_fd,) if read_fd is not None else (), **identity)
        finally:
            if read_fd is not None:
                os.close(read_fd)
        self._awaited.add(process.pid)
        output = _Output(limits.max_output_bytes,
                         on_limit=lambda: _kill_group(process.pid) if process.returncode is None else None)
        # The pipes are read to their end even past the limit (what comes after is dropped): asyncio reports the
        # exit only once both pipes closed, and a reader that stopped would leave a full pipe open.
        readers = asyncio.gather(*(_pump(stream, name, output) for stream, name in
                                   ((process.stdout, "stdout"), (process.stderr, "stderr"))))
        timed_out = False

        async def feed_and_read() -> None:
            await _feed(process, stdin)
            await asyncio.shield(readers)

        try:
            await asyncio.wait_for(feed_and_read(), timeout=limits.timeout_s)
        except TimeoutError:
            timed_out = True
        finally:
            if process.returncode is None:  # once reaped, its pid (the group's id) may belong to someone else
                _kill_group(process.pid)  # whatever is left of the call: its pid namespace goes with bwrap
        await readers
        status = await process.wait()
        self._awaited.discard(process.pid)
        if self._subreaper:
            reap_orphans(self._awaited)
        return RunOutcome(output.text("stdout"), output.text("stderr"), status, timed_out, output.truncated,
                          time.monotonic() - started)


def _prlimit(limits: ToolSettings) -> list[str]:
    # CPU: SIGXCPU at the soft limit, SIGKILL a second later. NPROC counts the call's uid's processes and threads.
    return ["prlimit", f"--cpu={limits.cpu_s}:{limits.cpu_s + 1}", f"--as={limits.memory_bytes}",
            f"--nproc={limits.max_processes}", f"--fsize={limits.max_file_bytes}", "--nofile=256", "--core=0", "--"]


async def _feed(process: asyncio.subprocess.Process, stdin: bytes) -> None:
    assert process.stdin is not None
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        process.stdin.write(stdin)
        await process.stdin.drain()
        process.stdin.close()


async def _pump(stream: asyncio.StreamReader | None, name: str, output: _Output) -> None:
    assert stream is not None
    while data := await stream.read(_READ_CHUNK):
        output.add(name, data)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
