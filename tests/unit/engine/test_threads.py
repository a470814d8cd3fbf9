"""engine.threads: the engine's process sets torch's intra-op threads explicitly, leaving a CPU to the rest."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from engine.threads import apply_threads, auto_threads, usable_cpus


@pytest.fixture(autouse=True)
def restore_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(("torch_default", "cpus", "expected"), [
    (2, 2, 1),     # a 2-core host: one core for the engine, one for the event loop and the host's services
    (8, 16, 8),    # hyperthreads: torch's one thread per physical core already leaves room
    (16, 16, 15),
    (1, 1, 1),     # never fewer than one
])
def test_auto_threads_leave_one_cpu_within_torchs_default(torch_default: int, cpus: int, expected: int) -> None:
    assert auto_threads(torch_default, cpus) == expected


def test_a_positive_count_is_set_as_it_is() -> None:
    assert apply_threads(1) == 1
    assert torch.get_num_threads() == 1


def test_zero_sets_the_auto_count() -> None:
    expected = auto_threads(torch.get_num_threads(), usable_cpus())
    assert apply_threads(0) == expected == torch.get_num_threads()


def test_none_leaves_torchs_setting_alone() -> None:
    torch.set_num_threads(1)
    assert apply_threads(None) == 1 == torch.get_num_threads()


def test_a_negative_count_is_refused() -> None:
    with pytest.raises(ValueError, match="threads must be 0"):
        apply_threads(-2)
