"""The autoscaler's control loop: observe, decide, apply; and what it does when Kafka does not answer.

Every ``interval_s`` the loop reads the load (:class:`streams.ops.lag.LoadProbe`), asks the decision function
(:class:`streams.ops.scaling.Autoscaler`) for a replica count and applies it to the fleet. When the observation
fails (Kafka lost, the group coordinator moving), the loop **holds its last decision**: it neither scales up nor
down on a load it cannot see, keeps the fleet at the last count (restarting a worker that died meanwhile), and says
so once, then again when Kafka answers. Every change, and why, is one line; so is every new load figure.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from streams.ops.lag import LoadProbe, Observation, ProbeError
from streams.ops.local_fleet import LocalFleet
from streams.ops.scaling import Autoscaler, Decision


@dataclass
class Controller:
    """Decisions, and holding the last one while the load cannot be read."""

    scaler: Autoscaler
    last: Decision | None = None
    lost_since: float | None = None

    def decide(self, now: float, observation: Observation, current: int) -> Decision:
        self.lost_since = None
        self.last = self.scaler.decide(now, observation.load, current)
        return self.last

    def hold(self, now: float, error: ProbeError, current: int) -> Decision:
        if self.lost_since is None:
            self.lost_since = now
        replicas = self.last.replicas if self.last is not None else current
        why = f"holding {replicas} (the last decision) for {now - self.lost_since:.0f} s: {error}"
        return Decision(replicas, replicas, self.last.active if self.last else True, why)


def describe(observation: Observation) -> str:
    load = observation.load
    lags = " ".join(f"{p}:{n}" for p, n in sorted(observation.lag_by_partition.items()))
    held = (f"in flight {load.in_flight} ({len(observation.workers)} worker(s) announced)" if observation.announced
            else "in flight unknown (no engine-worker announcements on the services topic)")
    return f"load {load.total}: lag {load.lag} [{lags}], {held}"


@dataclass
class ControlLoop:
    probe: LoadProbe
    fleet: LocalFleet
    controller: Controller
    say: Callable[[str], None]
    interval_s: float = 2.0
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    _last_line: str = ""
    _holding: bool = False

    async def run(self) -> None:
        try:
            while not self.stop.is_set():
                await self.step()
                try:
                    await asyncio.wait_for(self.stop.wait(), self.interval_s)
                except asyncio.TimeoutError:
                    pass
        finally:
            await self.probe.close()

    async def step(self) -> Decision:
        self.fleet.reap()
        now = time.monotonic()
        current = self.fleet.size
        try:
            observation = await self.probe.observe()
        except ProbeError as error:
            decision = self.controller.hold(now, error, current)
            if not self._holding:
                self.say(f"Kafka lost: {decision.why}")
                self._holding = True
        else:
            if self._holding:
                self.say("Kafka answers again: deciding from the load")
                self._holding = False
            decision = self.controller.decide(now, observation, current)
            line = f"{describe(observation)} -> {decision.raw} wanted"
            if line != self._last_line:
                self.say(line)
                self._last_line = line
        if decision.replicas != current:
            self.say(f"scale {current} -> {decision.replicas}: {decision.why}")
            self.fleet.scale_to(decision.replicas)
        return decision
