"""A canary rollout: start the candidate pool, move traffic to it step by step while the gates hold, roll back by
itself when one fails.

``run()`` is what ``specstream rollout start`` does:

1. publish ``starting`` (0 %), start the candidate pool: ``--workers`` local ``specstream worker`` processes with the
   candidate's configuration under the candidate topic prefix (0: the pool runs elsewhere, e.g. a Deployment);
2. wait until a candidate worker announced itself ready (``ready_timeout_s``); one that never does fails the first
   step;
3. for each step: publish ``running`` with its percentage (edges follow within a poll), hold ``hold_s`` while
   checking the gates every ``interval_s`` (:mod:`streams.ops.rollout_gates`; figures from Prometheus when
   ``ops.rollout.prometheus_url`` is set, :mod:`streams.ops.rollout_prometheus`, else from the bus), then run the
   optional eval gate (a command whose exit status decides, e.g. ``specstream eval replay ...``);
4. all steps held: ``completed`` (100 %: the candidate pool serves the model). A pool this process started stays
   its to own: it keeps running in the foreground until the rollout is ended (``rollout abort``, a newer rollout of
   the model, Ctrl-C or SIGTERM here: all traffic back to stable, then the pool is drained), so no candidate worker
   outlives the command that started it. With ``--workers 0`` the pool is its operator's and this process exits;
5. a failed gate: ``rolled_back`` (0 %) with the gate's reason, at once, then the candidate pool is drained.

``rollout pause`` freezes the step (the hold clock stops, the share stays), ``resume`` continues, ``abort`` sets 0 %
itself (edges follow within a poll, whether or not this process still runs) and makes this process drain the pool.
Ctrl-C or SIGTERM of this process rolls back: no share stays on a candidate that nothing watches. Every state names
this process (host, pid) and how many workers it started, so ``rollout status`` can say who stops what.

Kafka errors that retrying may fix (a broker restarting, a leader moving: three brokers with min ISR 2 still serve
with one down) are ridden through, each call asked again for up to ``ops.rollout.kafka_outage_s``. However the
controller ends (a verdict, an abort, a signal, Kafka failing past that bound, a bug), it first publishes
``rolled_back`` if its last state still sends traffic here (one bounded try: Kafka may be what failed), then drains
the workers it started (SIGTERM, then SIGKILL of each one's process group past its drain time).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from aiokafka.errors import KafkaError

from schemas.events import RolloutState
from schemas.topics import TopicCatalog
from streams.config import Settings
from streams.kafka import clients
from streams.ops.local_fleet import LocalFleet
from streams.ops.rollout_gates import Gates, PoolFigures, failed_gate
from streams.ops.rollout_prometheus import PrometheusError, PrometheusGates
from streams.ops.rollout_router import ROUTING_STATES, candidate_prefix
from streams.ops.rollout_store import RolloutStore
from streams.ops.rollout_watch import RolloutWatch
from streams.supervisor import STOP_TIMEOUT_S, service_argv

T = TypeVar("T")
KAFKA_FIRST_PAUSE_S = 0.5  # the pauses between tries of a failing Kafka call double from this ...
KAFKA_MAX_PAUSE_S = 5.0  # ... up to this, within ops.rollout.kafka_outage_s
LEAVE_TIMEOUT_S = 10.0  # the last state's one try when the rollout ends: the workers stop right after


@dataclass(frozen=True)
class RolloutPlan:
    candidate_config: Path
    model: str
    steps: list[float]
    hold_s: float
    workers: int = 1
    ready_timeout_s: float = 300.0
    interval_s: float = 1.0
    gates: Gates = field(default_factory=Gates)
    eval_gate: str | None = None  # a shell command run at the end of each step; non-zero fails it
    log_dir: Path | None = None
    drain_timeout_s: float = 30.0  # the candidate's worker.drain_timeout_s: how long its workers may take to drain


class Stopped(Exception):
    """The rollout ended here; the message says how."""


class KafkaOutage(KafkaError):
    """Kafka kept failing, with errors retrying may fix, for longer than ops.rollout.kafka_outage_s."""


class Rollout:
    def __init__(self, settings: Settings, plan: RolloutPlan, say: Callable[[str], None]) -> None:
        self.settings, self.plan, self.say = settings, plan, say
        self.store = RolloutStore(settings.kafka, settings.catalog)
        prefix = candidate_prefix(settings.kafka.topic_prefix)
        self.candidate = TopicCatalog(prefix, settings.kafka.request_partitions)
        self.state = RolloutState(model=plan.model, rollout_id=uuid.uuid4().hex[:12], candidate=str(plan.candidate_config),
                                  candidate_prefix=prefix, state="starting", percent=0.0, steps=plan.steps, at=time.time(),
                                  controller_host=socket.gethostname(), controller_pid=os.getpid(),
                                  local_workers=plan.workers)
        self.completed = False  # every step held its gates (whatever ended the rollout afterwards)
        self.fleet = LocalFleet(service_argv(str(plan.candidate_config), "worker"), say,
                                id_prefix=f"candidate-{os.getpid()}", env=self._candidate_env(), log_dir=plan.log_dir)
        self.watch = RolloutWatch(settings.kafka, settings.catalog, self.candidate)
        ops = settings.ops.rollout
        # Where the gates' figures come from: Prometheus' recording rules when there is one, else the bus.
        self.prometheus = (PrometheusGates(ops.prometheus_url, timeout_s=ops.prometheus_timeout_s)
                           if ops.prometheus_url else None)
        self._prometheus_failing = False
        self.interrupted = asyncio.Event()
        self._published = False  # a state of this rollout is on the topic: edges may route by it
        self._failing_since: float | None = None  # monotonic time of the first error of a Kafka outage

    def _candidate_env(self) -> dict[str, str]:
        """The candidate's file is its whole configuration: this process's SPECSTREAM_<SECTION>__<KEY> overrides
        (stable's) are not passed on. Set here: the same cluster and reply topics as stable, and the candidate's own
        request, cancellation, announcement and dead-letter topics."""
        kafka = self.settings.kafka
        env = {k: v for k, v in os.environ.items()
               if not (k.startswith("SPECSTREAM_") and ("__" in k or k == "SPECSTREAM_CONFIG"))}
        return {**env, "SPECSTREAM_KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
                "SPECSTREAM_KAFKA__TOPIC_PREFIX": self.candidate.prefix,
                "SPECSTREAM_KAFKA__REQUEST_PARTITIONS": str(kafka.request_partitions),
                "SPECSTREAM_DELIVERY__REPLY_TOPIC_PATTERNS": json.dumps([f"{kafka.topic_prefix}.replies.*"])}

    async def run(self) -> RolloutState:
        """Roll out. However it ends (a verdict, an abort, a signal, an error raised from here), the share leaves the
        candidate and the workers this process started are stopped before this returns or raises."""
        loop = asyncio.get_running_loop()
        # Ctrl-C or SIGTERM rolls back: nothing may stay on a candidate nobody watches.
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.interrupted.set)
        try:
            try:
                await self._roll_out()
                ended = "the controller ended"
            except Stopped as outcome:
                self.say(f"rollout {self.state.rollout_id}: {outcome}")
                ended = str(outcome)
            except BaseException as error:  # a bug, Kafka down past its bound, a cancellation: no orphan either
                await self._end(f"`rollout start` failed: {_one_line(error)}")
                raise
            await self._end(ended)
            return self.state
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    async def _roll_out(self) -> None:
        await self._kafka(self.store.start)
        await self._publish("starting", 0.0, f"starting {self.plan.workers} candidate worker(s)")
        self.fleet.scale_to(self.plan.workers)
        await self._wait_ready()
        await self._kafka(self.watch.start)
        for index, percent in enumerate(self.plan.steps):
            await self._step(index, percent)
        await self._publish("completed", self.plan.steps[-1], "every step held its gates")
        self.completed = True
        await self.watch.stop()  # nothing left to judge
        if self.plan.workers:
            await self._own_completed_pool()

    async def _end(self, reason: str) -> None:
        """The share leaves the candidate first (edges route everything to stable), then the workers this process
        started drain (killed past their drain time), then the Kafka clients stop."""
        try:
            await self._leave(reason)
        finally:
            await asyncio.to_thread(self.fleet.stop_all, self._stop_timeout_s())
            # Stopping must not hide what ended the rollout (a client of a cluster that is down may fail to).
            with contextlib.suppress(KafkaError):
                await self.watch.stop()
            with contextlib.suppress(KafkaError):
                await self.store.stop()

    async def _leave(self, reason: str) -> None:
        """Publish ``rolled_back`` unless the newest state already sends nothing here, is a newer rollout's, or is a
        completed one whose pool is its operator's (``--workers 0``). Bounded, and only tried: Kafka may be what
        failed, and the workers must stop all the same."""
        if not self._published or self.state.state not in ROUTING_STATES or self._superseded() \
                or (self.completed and not self.plan.workers):
            return
        try:
            await asyncio.wait_for(self._publish("rolled_back", 0.0, reason, retry=False), LEAVE_TIMEOUT_S)
        except (KafkaError, TimeoutError) as error:
            why = f"no answer within {LEAVE_TIMEOUT_S:g} s" if isinstance(error, TimeoutError) else _one_line(error)
            self.say(f"rollout {self.state.rollout_id}: could not record the rollback on "
                     f"{self.store.catalog.rollouts.name} ({why}): edges keep sending {self.state.percent:g} % of "
                     "requests to the candidate, whose workers stop now, until `specstream rollout abort` gets through")

    def _superseded(self) -> bool:
        """A newer rollout of the model took over: its state is not this process's to overwrite."""
        latest = self.store.latest(self.plan.model)
        return latest is not None and latest.rollout_id != self.state.rollout_id and latest.at >= self.state.at

    async def _own_completed_pool(self) -> None:
        """Keep the pool this process started until the rollout ends; the share leaves the pool before the pool goes."""
        pids = ", ".join(str(w.pid) for w in self.fleet.serving)
        self.say(f"the candidate pool serves 100 % (pids {pids}) and this process owns it: `specstream rollout abort` "
                 "(or Ctrl-C here) puts all traffic back on stable and drains it")
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.interrupted.wait(), self.plan.interval_s)
            if self.interrupted.is_set():
                await self._publish("aborted", 0.0, "interrupted (SIGINT/SIGTERM) at 100 %; all traffic back on stable")
                return
            ended = self._ended_elsewhere()
            if ended is not None:
                self.say(f"rollout {self.state.rollout_id}: {ended}; draining the candidate pool")
                return
            self.fleet.reap()
            if not self.fleet.serving:
                await self._publish("rolled_back", 0.0, "the candidate pool has no worker left (they exited) at 100 %")
                return

    def _ended_elsewhere(self) -> str | None:
        """Why the completed rollout was ended from outside this process (None: it was not)."""
        latest = self.store.latest(self.plan.model)
        if latest is None or latest.at < self.state.at:
            return None
        if latest.rollout_id != self.state.rollout_id:
            return f"a newer rollout of {self.plan.model} ({latest.rollout_id}) took over the candidate topics"
        if latest.state == "aborted":
            self.state = latest
            return f"aborted ({latest.reason}); all traffic on stable"
        return None

    def _stop_timeout_s(self) -> float:
        """A draining worker gets its drain time, plus what committing, leaving the group and exiting take."""
        return max(STOP_TIMEOUT_S, self.plan.drain_timeout_s + 15.0)

    async def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.plan.ready_timeout_s
        stale = self.settings.edge.ready_heartbeats * self.settings.worker.heartbeat_s
        while not await self._kafka(lambda: self.watch.candidate_ready(stale)):
            self.fleet.reap()
            if self.plan.workers and not self.fleet.serving:
                await self._fail("the candidate pool never became ready: every candidate worker exited")
            if time.monotonic() > deadline:
                await self._fail(f"the candidate pool never became ready within {self.plan.ready_timeout_s:g} s")
            await self._control()
            await asyncio.sleep(self.plan.interval_s)
        self.say("candidate pool ready")

    async def _step(self, index: int, percent: float) -> None:
        await self._publish("running", percent, f"step {index + 1} of {len(self.plan.steps)}", step=index)
        await self._kafka(self.watch.new_window)
        held = 0.0
        last = time.monotonic()
        while held < self.plan.hold_s:
            await self._kafka(lambda: self.watch.poll(self.plan.interval_s))
            await self._check_gates()
            paused = await self._control()
            now = time.monotonic()
            held += 0 if paused else now - last
            last = now
        await self._check_gates()
        failure = await asyncio.to_thread(self._eval_gate, percent)
        if failure is not None:
            await self._fail(failure)
        candidate, stable = await self._figures()
        self.say(f"step {percent:g} % held {self.plan.hold_s:g} s: candidate {candidate.summary()}; "
                 f"stable {stable.summary()} (from {candidate.source})")

    async def _check_gates(self) -> None:
        self.fleet.reap()
        if self.plan.workers and not self.fleet.serving:
            await self._fail("the candidate pool has no worker left (they exited)")
        candidate, stable = await self._figures()
        reason = failed_gate(self.plan.gates, candidate, stable, await self._kafka(self.watch.dead_letters))
        if reason is not None:
            await self._fail(reason)

    async def _figures(self) -> tuple[PoolFigures, PoolFigures]:
        """(candidate, stable): from Prometheus when configured and answering, else from the answers on the bus."""
        if self.prometheus is not None:
            try:
                figures = await self.prometheus.figures()
            except PrometheusError as error:
                if not self._prometheus_failing:
                    self.say(f"prometheus: {error}; the gates read the bus until it answers again")
                self._prometheus_failing = True
            else:
                if self._prometheus_failing:
                    self.say("prometheus answers again")
                self._prometheus_failing = False
                return figures
        return self.watch.window.candidate.figures(), self.watch.baseline.figures()

    def _eval_gate(self, percent: float) -> str | None:
        if not self.plan.eval_gate:
            return None
        self.say(f"eval gate at {percent:g} %: {self.plan.eval_gate}")
        result = subprocess.run(self.plan.eval_gate, shell=True, capture_output=True, text=True)  # noqa: S602
        if result.returncode == 0:
            return None
        tail = (result.stdout + result.stderr).strip().splitlines()[-1:] or [""]
        return f"eval gate at {percent:g} %: `{self.plan.eval_gate}` exited {result.returncode}: {tail[0]}"

    async def _control(self) -> bool:
        """Follow pause/resume/abort from the rollouts topic; True while paused."""
        if self.interrupted.is_set():
            await self._fail("interrupted (SIGINT/SIGTERM) while rolling out")
        latest = self.store.latest(self.plan.model)
        if latest is None or latest.rollout_id != self.state.rollout_id or latest.at < self.state.at:
            return self.state.state == "paused"  # nothing newer than what this process knows
        if latest.state == "aborted":
            self.state = latest
            raise Stopped(f"aborted ({latest.reason}); all traffic on stable")
        if latest.state == "paused" and self.state.state != "paused":
            self.say(f"paused at {latest.percent:g} % ({latest.reason})")
        elif latest.state == "running" and self.state.state == "paused":
            self.say("resumed")
        self.state = latest
        return latest.state == "paused"

    async def _fail(self, reason: str) -> None:
        await self._publish("rolled_back", 0.0, reason)
        raise Stopped(f"rolled back: {reason}")

    async def _publish(self, state: str, percent: float, reason: str, *, step: int | None = None,
                       retry: bool = True) -> None:
        new = self.state.model_copy(update={"state": state, "percent": percent, "reason": reason, "at": time.time(),
                                            "step": self.state.step if step is None else step})
        await (self._kafka(lambda: self.store.publish(new)) if retry else self.store.publish(new))
        # Only once it is on the topic: when the rollout ends, what edges route by is what _leave must undo.
        self.state, self._published = new, True
        self.say(f"rollout {self.state.rollout_id}: {state}, {percent:g} % to the candidate: {reason}")

    async def _kafka(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call()``, riding through what retrying may fix (clients.transient: a broker restarting, a leader moving)
        for up to ops.rollout.kafka_outage_s; then a :class:`KafkaOutage` naming the error."""
        bound = self.settings.ops.rollout.kafka_outage_s
        try:
            result = await clients.retrying(call, timeout_s=bound, pause_s=KAFKA_FIRST_PAUSE_S,
                                            max_pause_s=KAFKA_MAX_PAUSE_S, on_retry=self._kafka_failed)
        except KafkaError as error:
            if self._failing_since is None or not clients.transient(error):
                raise
            raise KafkaOutage(f"kafka kept failing for {time.monotonic() - self._failing_since:.0f} s, past "
                              f"ops.rollout.kafka_outage_s ({bound:g} s): {_one_line(error)}") from error
        if self._failing_since is not None:
            self.say(f"kafka answers again after {time.monotonic() - self._failing_since:.1f} s")
            self._failing_since = None
        return result

    def _kafka_failed(self, error: KafkaError) -> None:
        """Said once per outage; a SIGINT/SIGTERM meanwhile ends the rollout instead of waiting out the bound."""
        if self.interrupted.is_set():
            raise Stopped(f"interrupted (SIGINT/SIGTERM) while Kafka failed ({_one_line(error)})")
        if self._failing_since is None:
            self._failing_since = time.monotonic()
            self.say(f"kafka: {_one_line(error)}; asking again for up to "
                     f"{self.settings.ops.rollout.kafka_outage_s:g} s (ops.rollout.kafka_outage_s)")


def _one_line(error: BaseException) -> str:
    """The message alone (aiokafka's errors print their class name before it), or the class when there is none."""
    return str(error.args[0]) if error.args else type(error).__name__
