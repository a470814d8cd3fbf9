"""Collecting the exited processes bubblewrap leaves behind.

bubblewrap's intermediate process outlives the call's parent link and is re-parented to the nearest child
subreaper, else to PID 1. Where PID 1 does not reap (this development container; a pod without an init), each
call leaves a zombie owned by its slot's uid, and RLIMIT_NPROC counts zombies: after `max_processes` calls the
slot cannot fork at all ("bwrap: Can't fork for pid 1: Resource temporarily unavailable"). So the runner makes
itself the subreaper and collects them itself, leaving alone the children asyncio waits for.
"""
from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)
_PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def become_subreaper() -> bool:
    """Make orphaned descendants this process's children (Linux); False where that is not possible."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def reap_orphans(awaited: Iterable[int]) -> int:
    """Collect exited children other than ``awaited`` (those asyncio reaps); returns how many were collected."""
    keep = set(awaited)
    reaped = 0
    for children in Path("/proc/self/task").glob("*/children"):
        try:
            pids = [int(p) for p in children.read_text().split()]
        except OSError:
            continue
        for pid in pids:
            if pid in keep:
                continue
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                continue
            reaped += done == pid
    return reaped
