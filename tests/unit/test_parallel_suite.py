"""The suite's test processes (tests/parallel.py): what a process builds once is shared by tests that run in that
one process, and everything else is spread module by module."""
from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import parallel

ROOT = Path(__file__).parents[2]


def test_modules_on_the_session_edge_worker_are_one_group() -> None:
    for module in ("test_edge_openai.py", "test_edge_tools.py", "test_edge_security.py"):
        assert parallel.module_group(ROOT, f"tests/integration/{module}") == parallel.EDGE_WORKER


def test_modules_on_the_in_process_worker_harness_are_one_group() -> None:
    for module in ("test_worker_errors.py", "test_worker_stream.py"):
        assert parallel.module_group(ROOT, f"tests/integration/{module}") == parallel.HARNESS


def test_the_cluster_tier_is_one_group_and_any_other_module_its_own() -> None:
    assert parallel.module_group(ROOT, "tests/cluster/test_kafka_cluster.py") == parallel.CLUSTER
    assert parallel.module_group(ROOT, "tests/stacks/test_batch_api.py") == "tests/stacks/test_batch_api.py"
    assert parallel.module_group(ROOT, "tests/unit/test_config.py") == "tests/unit/test_config.py"


def test_the_scheduler_groups_node_ids_by_their_module() -> None:
    scheduler = parallel.SharedWorkScheduling.__new__(parallel.SharedWorkScheduling)
    scheduler.config = SimpleNamespace(rootpath=ROOT)
    assert scheduler._split_scope("tests/integration/test_edge_openai.py::test_x[a::b]") == parallel.EDGE_WORKER
    assert (scheduler._split_scope("tests/stacks/test_batch_api.py::TestA::test_y")
            == "tests/stacks/test_batch_api.py")


def test_groups_that_start_stacks_are_handed_out_before_unit_modules_and_larger_ones_first() -> None:
    queue = parallel.StacksFirst()
    for group, tests in [("tests/unit/test_config.py", 90), ("tests/stacks/test_rollout.py", 4),
                         (parallel.EDGE_WORKER, 60), ("tests/unit/test_layout.py", 5),
                         (parallel.CLUSTER, 7)]:
        queue[group] = {f"{group}::t{i}": False for i in range(tests)}
    order = [queue.popitem(last=False)[0] for _ in range(5)]
    assert order == [parallel.EDGE_WORKER, parallel.CLUSTER, "tests/stacks/test_rollout.py",
                     "tests/unit/test_config.py", "tests/unit/test_layout.py"]
    assert not queue


def test_processes_side_by_side_sleep_at_openmp_barriers_and_one_process_keeps_the_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setenv("OMP_WAIT_POLICY", "")  # recorded, so that what the test sets is undone
    monkeypatch.delenv("OMP_WAIT_POLICY")
    parallel.threads_sleep_at_barriers(SimpleNamespace(getoption=lambda name, default=None: None))
    assert "OMP_WAIT_POLICY" not in os.environ
    parallel.threads_sleep_at_barriers(SimpleNamespace(getoption=lambda name, default=None: 3))
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # the user's own choice stands
    parallel.threads_sleep_at_barriers(SimpleNamespace(getoption=lambda name, default=None: 3))
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"
