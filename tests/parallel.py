"""How `./dev test` shares the suite between test processes (pytest-xdist, ``-n N --dist loadgroup``).

The suite's processes use about one of two cores (an engine keeps one thread, and much of an integration test waits
on Kafka, a subprocess or a socket), so test processes side by side finish it in about half the time. What must not
be split is what a process builds once and shares: a module's stack (module-scoped fixtures), the session's
in-process engine worker (``worker_harness``), the edge modules' ``specstream worker`` subprocess
(``tests.edge_support.shared_worker``) and the three-node cluster of tests/cluster. Each of those is one work group,
run by one process in collection order; anything else is grouped by module. Groups that start stacks or load the
model (integration and cluster) are handed out first, largest first, and the unit modules fill the gaps at the end:
a long group handed out last would finish alone.

pytest-xdist's own ``loadgroup`` reads ``xdist_group`` marks by rewriting each item's node id, which pytest 9 no
longer allows (every test becomes a group of its own); the groups here come from the node id's module instead.
"""
from __future__ import annotations

import functools
import os
import re
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

CLUSTER = "cluster"
HARNESS = "worker_harness"
EDGE_WORKER = "edge_worker"
_USES_HARNESS = re.compile(r"\b(worker_harness|reply_inbox)\b")


def in_a_test_process() -> bool:
    """True in a pytest-xdist worker (the processes that run tests beside each other)."""
    return "PYTEST_XDIST_WORKER" in os.environ


def one_thread_each() -> None:
    """One torch thread in this test process and in every process it starts. Several processes each running a
    thread per core wait at every parallel region's barrier for a thread another process has descheduled (GEMMs
    20-40x slower); a test about threads sets its own count, and a stack's worker takes one thread anyway."""
    import torch

    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


def threads_sleep_at_barriers(config: pytest.Config) -> None:
    """In the controller, before xdist starts its processes (they inherit the environment): OpenMP threads that wait
    at a barrier sleep at once instead of spinning. Beside other test processes a spinning thread burns the core its
    partner needs (a two-thread test took 23 s beside two busy processes, 18 s with this)."""
    if (config.getoption("numprocesses", None) or 0) and not in_a_test_process():
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@functools.cache
def module_group(root: Path, module: str) -> str:
    """The work group of a test module (a path relative to the root): what its tests share with other modules."""
    if module.startswith("tests/cluster/"):
        return CLUSTER
    source = (root / module).read_text(encoding="utf-8")
    if "shared_worker(" in source:
        return EDGE_WORKER
    if _USES_HARNESS.search(source):
        return HARNESS
    return module


def hand_out_order(group: str, tests: int) -> tuple[bool, int]:
    """Sort key of a work group: stack and model groups before unit modules, then more tests first."""
    return group.startswith("tests/unit/"), -tests


class StacksFirst(OrderedDict[str, dict[str, bool]]):
    """xdist's queue of work groups (group -> {node id: done}); it takes the next group with popitem(last=False)."""

    def popitem(self, last: bool = True) -> tuple[str, dict[str, bool]]:
        group = min(self, key=lambda g: hand_out_order(g, len(self[g])))
        return group, self.pop(group)


class SharedWorkScheduling(LoadScopeScheduling):
    """pytest-xdist's scope scheduling (a group runs whole on one process), with the groups above as scopes."""

    def __init__(self, config: Any, log: Any = None) -> None:
        super().__init__(config, log)
        self.workqueue = StacksFirst()

    def _split_scope(self, nodeid: str) -> str:
        return module_group(self.config.rootpath, nodeid.split("::", 1)[0])
