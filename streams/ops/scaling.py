"""How many engine workers the backlog asks for: KEDA's Kafka-scaler semantics, plus requests in flight.

One decision function, the same whether `specstream autoscale` applies it to local processes or KEDA applies
it to a Deployment (:func:`scaled_object` renders the same parameters as a ``ScaledObject``):

* **load** = consumer lag of the worker group (end offset - committed offset, summed over the request topic's
  partitions) and the requests the workers hold in flight (from their announcements). For a consumer that commits
  on read, lag alone reads zero while a worker holds 128 requests, so load is lag + in flight. specstream's workers
  commit a request only once its answer is stored (at least once), so their lag already counts every request held:
  there load is max(lag, in flight), the announcements a guard, not an addend (``Load.in_flight_in_lag``).
* **active** when load > ``activation_lag_threshold``; an inactive deployment scales to ``min_replicas`` (zero
  only when asked: ``min_replicas=0``).
* **raw replicas** = ceil(load / ``lag_threshold``), at most the partition count unless ``allow_idle_consumers``
  (more consumers than partitions sit idle), then clamped to [max(min, 1), max] when active.
* **stabilisation** as the HPA does it: going up takes the lowest recommendation of the last
  ``scale_up_window_s``, going down the highest of the last ``scale_down_window_s``, so a burst that comes and
  goes, or a rebalance that briefly stalls commits, does not make workers come and go (every change of the
  worker set is a rebalance that pauses the group for a moment).
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ScalePolicy:
    min_replicas: int = 1
    max_replicas: int = 4
    lag_threshold: int = 16  # target load per worker: requests waiting or in flight
    activation_lag_threshold: int = 0
    allow_idle_consumers: bool = False
    scale_up_window_s: float = 0.0
    scale_down_window_s: float = 60.0

    def __post_init__(self) -> None:
        if self.min_replicas < 0 or self.max_replicas < max(1, self.min_replicas):
            raise ValueError(f"replicas: need 0 <= min ({self.min_replicas}) <= max ({self.max_replicas}), max >= 1")
        if self.lag_threshold <= 0:
            raise ValueError(f"lag_threshold must be positive, got {self.lag_threshold}")
        if self.activation_lag_threshold < 0 or self.scale_up_window_s < 0 or self.scale_down_window_s < 0:
            raise ValueError("activation_lag_threshold and the windows must not be negative")


@dataclass(frozen=True)
class Load:
    lag: int  # summed over partitions, negative lags (a reset group) counted as 0
    in_flight: int
    partitions: int
    # True when the consumers commit a message only after answering it (specstream's workers): the lag then
    # already includes what they hold, and adding in-flight counts would count it twice.
    in_flight_in_lag: bool = True

    @property
    def total(self) -> int:
        lag, held = max(0, self.lag), max(0, self.in_flight)
        return max(lag, held) if self.in_flight_in_lag else lag + held


@dataclass(frozen=True)
class Decision:
    replicas: int
    raw: int  # before stabilisation
    active: bool
    why: str


def raw_replicas(policy: ScalePolicy, load: Load) -> tuple[int, bool]:
    """The replicas this load asks for right now, and whether the deployment is active."""
    active = load.total > policy.activation_lag_threshold
    if not active:
        return policy.min_replicas, False
    wanted = math.ceil(load.total / policy.lag_threshold)
    if not policy.allow_idle_consumers:
        wanted = min(wanted, max(1, load.partitions))
    return max(max(policy.min_replicas, 1), min(policy.max_replicas, wanted)), True


@dataclass
class Autoscaler:
    """Applies :func:`raw_replicas` with the stabilisation windows; feed it one observation at a time."""

    policy: ScalePolicy
    _history: deque[tuple[float, int]] = field(default_factory=deque)

    def decide(self, now: float, load: Load, current: int) -> Decision:
        raw, active = raw_replicas(self.policy, load)
        self._history.append((now, raw))
        keep = max(self.policy.scale_up_window_s, self.policy.scale_down_window_s)
        while self._history and now - self._history[0][0] > keep:
            self._history.popleft()
        up_to = min(r for t, r in self._history if now - t <= self.policy.scale_up_window_s)
        down_to = max(r for t, r in self._history if now - t <= self.policy.scale_down_window_s)
        if current < up_to:
            replicas, why = up_to, f"load {load.total} (lag {load.lag}, in flight {load.in_flight}) asks for {raw}"
        elif current > down_to:
            replicas, why = down_to, f"load {load.total} has asked for at most {down_to} for " \
                                     f"{self.policy.scale_down_window_s:g} s"
        else:
            replicas = current
            why = "steady" if raw == current else f"holding {current}: load asks for {raw}, within the window"
        return Decision(replicas, raw, active, why)


def scaled_object(policy: ScalePolicy, *, name: str, deployment: str, bootstrap_servers: str, consumer_group: str,
                  topic: str, namespace: str | None = None, polling_interval_s: int = 15) -> dict[str, Any]:
    """The same policy as a KEDA ``ScaledObject`` with a Kafka trigger.

    Pitfalls from KEDA's documentation handled here: the topic is always set (without it KEDA sums the lag of
    every topic the group reads, cancellations included, and caps replicas by all their partitions);
    ``offsetResetPolicy`` matches the workers' ``auto_offset_reset`` (earliest), so a group without commits counts
    the whole backlog as lag instead of none; scale-to-zero only when ``min_replicas`` is 0. KEDA cannot see the
    workers' announcements, but it needs none: the workers commit a request only once it is answered, so the lag
    KEDA reads already counts the requests they hold, and the same lagThreshold means the same thing to both.
    """
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": metadata,
        "spec": {
            "scaleTargetRef": {"name": deployment},
            "pollingInterval": polling_interval_s,
            "cooldownPeriod": int(policy.scale_down_window_s),
            "minReplicaCount": policy.min_replicas,
            "maxReplicaCount": policy.max_replicas,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
                "scaleUp": {"stabilizationWindowSeconds": int(policy.scale_up_window_s)},
                "scaleDown": {"stabilizationWindowSeconds": int(policy.scale_down_window_s)},
            }}},
            "triggers": [{
                "type": "kafka",
                "metadata": {
                    "bootstrapServers": bootstrap_servers,
                    "consumerGroup": consumer_group,
                    "topic": topic,
                    "lagThreshold": str(policy.lag_threshold),
                    "activationLagThreshold": str(policy.activation_lag_threshold),
                    "offsetResetPolicy": "earliest",
                    "allowIdleConsumers": "true" if policy.allow_idle_consumers else "false",
                    "scaleToZeroOnInvalidOffset": "false",
                },
            }],
        },
    }
