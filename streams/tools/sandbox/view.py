"""What a sandboxed call sees and may do: the bubblewrap command line.

The view is the host's ``/usr`` read-only (the interpreter and its standard library) with the usual top-level
links into it, a fresh ``/proc`` of its own pid namespace, a minimal ``/dev``, and a private size-bounded tmpfs
at ``/tmp`` as its working directory. Nothing else of the host exists in it: not ``/etc``, ``/home``, ``/root``,
``/work`` or ``/var``, so the project's keys file, configuration and state folders are not there to read.
Every namespace is new (user, pid, network, ipc, uts, cgroup): no network at all, no other process visible.
"""
from __future__ import annotations

import os
from pathlib import Path

# The read-only part of the view: /usr, and the top-level directories that point into it on a merged-/usr system.
_SYSTEM_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


def system_binds(root: Path = Path("/")) -> list[str]:
    args = ["--ro-bind", str(root / "usr"), "/usr"]
    for name in _SYSTEM_DIRS:
        host = root / name
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), f"/{name}"]
        elif host.is_dir():
            args += ["--ro-bind", str(host), f"/{name}"]
    return args


def bwrap_argv(bwrap: str, *, tmp_bytes: int, seccomp_fd: int | None) -> list[str]:
    """bubblewrap's options, up to (not including) the command it runs."""
    argv = [
        bwrap,
        "--unshare-all", "--unshare-user",  # user, pid, network, ipc, uts and cgroup namespaces of its own
        "--disable-userns",  # and no nested user namespace from inside (a large kernel attack surface)
        "--die-with-parent",  # the runner (or its kill of bwrap) takes the whole pid namespace down
        "--new-session",  # setsid: no ioctl(TIOCSTI) into a terminal it inherited
        "--cap-drop", "ALL",
        "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp",
        "--setenv", "LANG", "C.UTF-8", "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
        "--hostname", "sandbox",
        *system_binds(),
        "--proc", "/proc",
        "--dev", "/dev",
        "--size", str(tmp_bytes), "--tmpfs", "/tmp",
        "--chdir", "/tmp",
    ]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    return argv
