"""Commit positions: everything below is answered, whatever order requests finish in."""
from streams.service.offsets import OffsetTracker


def test_position_waits_for_the_oldest_unfinished_request() -> None:
    offsets = OffsetTracker()
    for offset in (10, 11, 12):
        offsets.started("requests", 0, offset)
    assert offsets.committable() == {("requests", 0): 10}  # nothing answered: resume at 10

    offsets.finished("requests", 0, 12)  # a short request overtook two long ones
    assert offsets.committable() == {("requests", 0): 10}
    offsets.finished("requests", 0, 10)
    assert offsets.committable() == {("requests", 0): 11}
    offsets.mark_committed({("requests", 0): 11})
    assert offsets.committable() == {}  # nothing new to commit

    offsets.finished("requests", 0, 11)
    assert offsets.committable() == {("requests", 0): 13}


def test_partitions_are_independent() -> None:
    offsets = OffsetTracker()
    offsets.started("requests", 0, 5)
    offsets.started("requests", 1, 7)
    offsets.finished("requests", 1, 7)
    assert offsets.committable() == {("requests", 0): 5, ("requests", 1): 8}
    assert offsets.in_flight("requests", 0) == 1 and offsets.in_flight("requests", 1) == 0


def test_a_revoked_partition_is_forgotten() -> None:
    offsets = OffsetTracker()
    offsets.started("requests", 0, 5)
    offsets.forget("requests", 0)
    offsets.finished("requests", 0, 5)  # finishing after the revocation commits nothing
    assert offsets.committable() == {}
