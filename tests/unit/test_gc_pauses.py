"""Services freeze their start-up heap so later full collections do not walk it (streams.service.gc_pauses)."""
from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from streams.service.gc_pauses import freeze_startup_heap


class _Node:
    def __init__(self) -> None:
        self.peer: _Node | None = None


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_objects_alive_at_start_up_leave_the_oldest_generation(unfrozen: None) -> None:
    long_lived = [_Node() for _ in range(1000)]
    frozen = freeze_startup_heap("test")
    # It reports what it froze; frozen objects that die by refcount (another test's thread letting go of
    # one) only ever lower the count after that.
    assert frozen >= len(long_lived) and frozen - 100 <= gc.get_freeze_count() <= frozen
    in_oldest = {id(o) for o in gc.get_objects(generation=2)}
    assert not any(id(node) in in_oldest for node in long_lived)
    gc.collect()  # a full collection leaves them frozen (other frozen objects may die by refcount meanwhile)
    in_oldest = {id(o) for o in gc.get_objects(generation=2)}
    assert not any(id(node) in in_oldest for node in long_lived)


def test_start_up_garbage_is_collected_not_frozen(unfrozen: None) -> None:
    a, b = _Node(), _Node()
    a.peer, b.peer = b, a  # a cycle only the collector frees
    gone = weakref.ref(a)
    del a, b
    freeze_startup_heap("test")
    assert gone() is None


def test_objects_made_after_the_freeze_are_still_collected(unfrozen: None) -> None:
    freeze_startup_heap("test")
    a, b = _Node(), _Node()
    a.peer, b.peer = b, a
    gone = weakref.ref(a)
    del a, b
    gc.collect()
    assert gone() is None
