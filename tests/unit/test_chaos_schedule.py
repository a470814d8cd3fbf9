"""The chaos soak's fault schedule (bench/chaos/schedule.py): seeded, complete, and spaced so that at most one broker
is out at a time and one service kind is never down twice at once."""
from __future__ import annotations

import pytest

from bench.chaos.schedule import BROKER_GAP_S, EDGE_GAP_S, SAME_KIND_GAP_S, SERVICE_KINDS, WINDOW, build

ARGS = {"kills_per_kind": 2, "broker_down_s": 20.0, "broker_pause_s": 15.0, "poison_rounds": 2}


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    assert build(3, 1200, **ARGS) == build(3, 1200, **ARGS)
    assert build(3, 1200, **ARGS) != build(4, 1200, **ARGS)


def test_every_fault_the_issue_lists_is_scheduled_within_the_window() -> None:
    faults = build(1, 1200, **ARGS)
    kinds = [f.kind for f in faults]
    for kind in ("term", "broker-kill", "broker-pause", "redis-restart", "reply-topic-delete"):
        assert kinds.count(kind) == 1, kind
    assert kinds.count("poison") == 2
    killed = [f.target.rsplit("-", 1)[0] if f.target not in SERVICE_KINDS else f.target
              for f in faults if f.kind == "kill"]
    assert {k: killed.count(k) for k in SERVICE_KINDS} == {k: 2 for k in SERVICE_KINDS}
    assert all(WINDOW[0] * 1200 <= f.at_s <= WINDOW[1] * 1200 for f in faults)
    assert [f.at_s for f in faults] == sorted(f.at_s for f in faults)


@pytest.mark.parametrize("seed", range(20))
def test_broker_faults_kills_of_one_kind_and_edge_restarts_never_overlap(seed: int) -> None:
    faults = build(seed, 1200, **ARGS)
    broker = [f for f in faults if f.kind.startswith("broker")]
    first, second = broker
    assert second.at_s - first.at_s >= first.hold_s + BROKER_GAP_S
    for kind in SERVICE_KINDS:
        times = [f.at_s for f in faults if f.kind == "kill" and f.target.startswith(kind)]
        assert all(b - a >= SAME_KIND_GAP_S - 0.1 for a, b in zip(times, times[1:]))
    edge_restarts = [f.at_s for f in faults if f.kind in ("kill", "term") and f.target.startswith("edge")]
    assert all(b - a >= EDGE_GAP_S - 0.1 for a, b in zip(edge_restarts, edge_restarts[1:]))


def test_a_run_too_short_for_its_faults_is_refused_naming_why() -> None:
    with pytest.raises(ValueError, match="run longer"):
        build(1, 60, **ARGS)
