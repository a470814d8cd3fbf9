"""The rollout controller (streams/ops/rollout.py) rides through Kafka errors that retrying may fix, and however it
ends (an error, Kafka down past its bound, SIGTERM) leaves no candidate worker behind and puts the share back on
stable when Kafka takes it.

The controller's own code runs; the rollouts topic and what it watches on the bus are in memory, scripted to fail
the way a three-broker cluster does while one broker restarts (aiokafka's NodeNotReadyError, a timed-out request, a
moving leader). The candidate workers are real processes started by the controller's LocalFleet: a stand-in that
says it is ready once it handles SIGTERM, and drains (exits 0) on it. On the real workers and broker:
tests/stacks/test_rollout.py.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import signal
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest
from aiokafka.errors import (
    KafkaConnectionError,
    NodeNotReadyError,
    NotLeaderForPartitionError,
    RequestTimedOutError,
)

from schemas.events import RolloutState
from schemas.topics import TopicCatalog
from streams.config import Settings
from streams.ops import rollout as controller
from streams.ops.local_fleet import LocalFleet
from streams.ops.rollout import KafkaOutage, Rollout, RolloutPlan
from streams.ops.rollout_gates import PoolStats
from streams.ops.rollout_watch import Window

NOT_READY = "Attempt to send a request to node which is not ready (node id 3)."
# A candidate worker: ready (the file) once SIGTERM drains it; ``ignore``: one that never drains.
WORKER = """import pathlib, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN if sys.argv[2] == "ignore" else lambda *_: sys.exit(0))
pathlib.Path(sys.argv[1]).touch()
time.sleep(600)
"""


class Scripted:
    """Each call of a method raises the next error scripted for it (None, or the script's end: it answers)."""

    def __init__(self, errors: dict[str, Iterable[BaseException | None]]) -> None:
        self._errors: dict[str, Iterator[BaseException | None]] = {k: iter(v) for k, v in errors.items()}
        self.calls: dict[str, int] = {}

    def _call(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        error = next(self._errors.get(name, iter(())), None)
        if error is not None:
            raise error


class Topic(Scripted):
    """The rollouts topic: what was published, in order."""

    def __init__(self, **errors: Iterable[BaseException | None]) -> None:
        super().__init__(errors)
        self.catalog = TopicCatalog("test")
        self.published: list[RolloutState] = []

    async def start(self) -> None:
        self._call("start")

    async def stop(self) -> None:
        pass

    async def publish(self, state: RolloutState) -> None:
        self._call("publish")
        self.published.append(state)

    def latest(self, model: str) -> RolloutState | None:
        return None


class Bus(Scripted):
    """What the controller watches: no answers, no dead letters; the candidate is ready once its worker is."""

    def __init__(self, ready: Path, **errors: Iterable[BaseException | None]) -> None:
        super().__init__(errors)
        self.ready = ready
        self.window, self.baseline = Window(), PoolStats()

    async def start(self) -> None:
        self._call("start")

    async def stop(self) -> None:
        pass

    async def new_window(self) -> None:
        self._call("new_window")

    async def poll(self, timeout_s: float) -> None:
        self._call("poll")
        await asyncio.sleep(timeout_s)

    async def dead_letters(self) -> int:
        self._call("dead_letters")
        return 0

    async def candidate_ready(self, stale_after_s: float) -> bool:
        self._call("candidate_ready")
        return self.ready.exists()


Make = Callable[..., tuple[Rollout, list[str]]]


@pytest.fixture
def make_rollout(tmp_path: Path) -> Iterator[Make]:
    """``make(topic, bus, workers=1, drains=True, outage_s=120)``: a controller with two steps (50, 100) of 0.2 s
    each, on ``topic`` and ``bus``, and what it says. A worker a failing test left is killed."""
    made: list[list[str]] = []

    def make(topic: Topic, bus: Bus, *, workers: int = 1, drains: bool = True,
             outage_s: float = 120.0) -> tuple[Rollout, list[str]]:
        said: list[str] = []
        made.append(said)
        plan = RolloutPlan(candidate_config=tmp_path / "candidate.yaml", model="m", steps=[50.0, 100.0], hold_s=0.2,
                           workers=workers, ready_timeout_s=60.0, interval_s=0.02)
        rollout = Rollout(Settings(ops={"rollout": {"kafka_outage_s": outage_s}}), plan, said.append)
        rollout.store, rollout.watch = topic, bus  # type: ignore[assignment]
        rollout.fleet = LocalFleet([sys.executable, "-c", WORKER, str(bus.ready), "drain" if drains else "ignore"],
                                   said.append, id_prefix="candidate-test")
        return rollout, said

    yield make
    for pid in (pid for said in made for pid in started(said)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


@pytest.fixture(autouse=True)
def _short_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(controller, "KAFKA_FIRST_PAUSE_S", 0.01)
    monkeypatch.setattr(controller, "KAFKA_MAX_PAUSE_S", 0.05)


def started(said: list[str]) -> list[int]:
    return [int(m.group(1)) for line in said if (m := re.match(r"candidate-test-\d+: started \(pid (\d+)\)", line))]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def states(topic: Topic) -> list[tuple[str, float]]:
    return [(s.state, s.percent) for s in topic.published]


async def test_a_broker_restarting_at_the_50_percent_step_is_ridden_through_to_completion(
        tmp_path: Path, make_rollout: Make) -> None:
    # starting and running 50 % go out; then the broker dies: the 100 % step's publish fails twice, polls fail.
    topic = Topic(publish=[None, None, NodeNotReadyError(NOT_READY), KafkaConnectionError("connection refused")])
    bus = Bus(tmp_path / "ready", candidate_ready=[NodeNotReadyError(NOT_READY)],
              poll=[None, RequestTimedOutError(), NotLeaderForPartitionError(), NodeNotReadyError(NOT_READY)],
              dead_letters=[None, NodeNotReadyError(NOT_READY)])
    (tmp_path / "ready").touch()  # the pool runs elsewhere (--workers 0), and is ready
    rollout, said = make_rollout(topic, bus, workers=0)
    state = await rollout.run()
    assert rollout.completed and (state.state, state.percent) == ("completed", 100.0)
    assert states(topic) == [("starting", 0.0), ("running", 50.0), ("running", 100.0), ("completed", 100.0)]
    assert topic.calls["publish"] == 6 and bus.calls["poll"] > 4
    assert any(line.startswith(f"kafka: {NOT_READY}; asking again for up to 120 s") for line in said), said
    assert any(line.startswith("kafka answers again after") for line in said), said


async def test_an_error_in_a_step_drains_the_candidate_workers_and_records_the_rollback(
        tmp_path: Path, make_rollout: Make) -> None:
    topic = Topic()
    bus = Bus(tmp_path / "ready", dead_letters=[RuntimeError("a gate's bug")])
    rollout, said = make_rollout(topic, bus)
    with pytest.raises(RuntimeError, match="a gate's bug"):
        await rollout.run()
    [worker] = started(said)
    assert not alive(worker)
    assert any(re.match(rf"candidate-test-1 \(pid {worker}\) drained: exited with status 0", line) for line in said)
    assert states(topic) == [("starting", 0.0), ("running", 50.0), ("rolled_back", 0.0)]
    assert topic.published[-1].reason == "`rollout start` failed: a gate's bug"
    assert not rollout.completed


async def test_kafka_failing_past_its_bound_ends_with_one_line_and_no_worker_left(
        tmp_path: Path, make_rollout: Make) -> None:
    # The broker goes at the 50 % step and does not come back: nothing gets through, the rollback neither.
    down = itertools.repeat(NodeNotReadyError(NOT_READY))
    topic = Topic(publish=itertools.chain([None, None], down))
    bus = Bus(tmp_path / "ready", poll=itertools.chain([None], down))
    rollout, said = make_rollout(topic, bus, outage_s=0.5)
    with pytest.raises(KafkaOutage) as raised:
        await rollout.run()
    # What `rollout start` prints after "rollout: error: ".
    expected = rf"kafka kept failing for \d+ s, past ops.rollout.kafka_outage_s \(0.5 s\): {re.escape(NOT_READY)}"
    assert re.fullmatch(expected, raised.value.args[0]), raised.value.args
    [worker] = started(said)
    assert not alive(worker)
    assert states(topic) == [("starting", 0.0), ("running", 50.0)]
    assert any("could not record the rollback" in line and "edges keep sending 50 %" in line for line in said), said


async def test_sigterm_during_a_kafka_outage_ends_the_rollout_at_the_next_try(
        tmp_path: Path, make_rollout: Make) -> None:
    async def poll(timeout_s: float) -> None:
        if bus.calls.get("poll", 0) == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # to this process: the controller's handler takes it
        await Bus.poll(bus, timeout_s)

    topic = Topic()
    bus = Bus(tmp_path / "ready", poll=itertools.chain([None], itertools.repeat(NodeNotReadyError(NOT_READY))))
    bus.poll = poll  # type: ignore[method-assign]
    rollout, said = make_rollout(topic, bus)
    state = await asyncio.wait_for(rollout.run(), 60)  # not the 120 s of kafka_outage_s
    assert (state.state, state.percent) == ("rolled_back", 0.0) and not rollout.completed
    assert state.reason == f"interrupted (SIGINT/SIGTERM) while Kafka failed ({NOT_READY})"
    [worker] = started(said)
    assert not alive(worker)


async def test_a_worker_that_does_not_drain_is_killed_after_its_drain_time(
        tmp_path: Path, make_rollout: Make, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Rollout, "_stop_timeout_s", lambda self: 0.5)
    topic = Topic()
    bus = Bus(tmp_path / "ready", poll=[RuntimeError("a bug")])
    rollout, said = make_rollout(topic, bus, drains=False)
    with pytest.raises(RuntimeError):
        await rollout.run()
    [worker] = started(said)
    assert not alive(worker)
    assert any(line == f"candidate-test-1 (pid {worker}) killed: not drained within 0.5 s" for line in said), said
    assert states(topic)[-1] == ("rolled_back", 0.0)
