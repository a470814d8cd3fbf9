"""Torch's intra-op threads for the engine's process, set once and explicitly before the model loads.

Torch's default is one OpenMP thread per physical core. An engine worker is not alone on its host: its own event
loop (Kafka reads, replies) runs beside the engine thread, and on a small host the edge, a batch assembler and
clients do too. Every forward is a series of OpenMP parallel regions whose threads wait for each other at the end
of each; when one of them is descheduled for another process, the whole team waits for it, and a step takes
several times as long (issue 18's engine profile on a loaded 2-core machine: steps of 1.5-8 s with 2 threads
against 0.1-0.4 s with 1). So by default the engine leaves one of the CPUs it may use to everything else.
"""
from __future__ import annotations

import os

import torch


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one, else all of them)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def auto_threads(torch_default: int, cpus: int) -> int:
    """Torch's own default (a thread per physical core, or OMP_NUM_THREADS), but one CPU fewer than the process
    may use, and at least one."""
    return max(1, min(torch_default, cpus - 1))


def apply_threads(requested: int | None) -> int:
    """Set torch's intra-op threads: ``requested`` > 0 as it is, 0 auto_threads, None leaves torch as it is.

    Returns the count in effect.
    """
    if requested is None:
        return torch.get_num_threads()
    if requested < 0:
        raise ValueError(f"threads must be 0 (auto) or positive, got {requested}")
    threads = requested or auto_threads(torch.get_num_threads(), usable_cpus())
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads
