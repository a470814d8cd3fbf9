"""The autoscaling decision: KEDA's Kafka-scaler arithmetic, plus in-flight requests and HPA-style windows."""
from __future__ import annotations

import pytest

from streams.ops.scaling import Autoscaler, Load, ScalePolicy, raw_replicas, scaled_object

POLICY = ScalePolicy(min_replicas=1, max_replicas=4, lag_threshold=10, scale_up_window_s=0, scale_down_window_s=60)


@pytest.mark.parametrize(("lag", "in_flight", "partitions", "replicas"), [
    (0, 0, 6, 1),  # idle: the minimum
    (10, 0, 6, 1),  # exactly one worker's worth
    (11, 0, 6, 2),  # ceil(11 / 10)
    (0, 25, 6, 3),  # lag alone is zero while workers hold requests: in flight counts
    (1000, 0, 6, 4),  # capped by max_replicas
    (1000, 0, 2, 2),  # capped by the partitions: a third consumer would sit idle
    (-5, 0, 6, 1),  # a group reset past the end counts no lag
])
def test_replicas_are_ceil_of_load_over_threshold_within_bounds(lag: int, in_flight: int, partitions: int,
                                                                 replicas: int) -> None:
    assert raw_replicas(POLICY, Load(lag, in_flight, partitions))[0] == replicas


def test_idle_consumers_may_exceed_the_partitions_when_allowed() -> None:
    policy = ScalePolicy(max_replicas=8, lag_threshold=10, allow_idle_consumers=True)
    assert raw_replicas(policy, Load(1000, 0, 2))[0] == 8


def test_scale_to_zero_only_when_asked_and_activation_threshold_wakes_it() -> None:
    zero = ScalePolicy(min_replicas=0, max_replicas=3, lag_threshold=10, activation_lag_threshold=5)
    assert raw_replicas(zero, Load(5, 0, 6)) == (0, False)  # at the activation threshold: still asleep
    assert raw_replicas(zero, Load(6, 0, 6)) == (1, True)  # above it: at least one, even below lagThreshold
    assert raw_replicas(POLICY, Load(0, 0, 6)) == (1, False)  # min 1: never zero


def test_scale_up_is_immediate_and_scale_down_waits_out_the_window() -> None:
    scaler = Autoscaler(POLICY)
    assert scaler.decide(0.0, Load(35, 0, 6), current=1).replicas == 4
    assert scaler.decide(10.0, Load(0, 0, 6), current=4).replicas == 4  # the burst is gone, but recently
    assert scaler.decide(59.0, Load(0, 0, 6), current=4).replicas == 4
    decision = scaler.decide(71.0, Load(0, 0, 6), current=4)
    assert decision.replicas == 1 and "60 s" in decision.why


def test_a_short_dip_during_a_rebalance_does_not_scale_down() -> None:
    scaler = Autoscaler(POLICY)
    for t in range(0, 50, 5):
        load = Load(0, 0, 6) if t == 20 else Load(30, 0, 6)
        assert scaler.decide(float(t), load, current=3).replicas == 3


def test_a_scale_up_window_ignores_a_single_spike() -> None:
    scaler = Autoscaler(ScalePolicy(max_replicas=4, lag_threshold=10, scale_up_window_s=30))
    assert scaler.decide(0.0, Load(5, 0, 6), current=1).replicas == 1
    assert scaler.decide(5.0, Load(40, 0, 6), current=1).replicas == 1  # the lowest of the last 30 s is 1
    assert scaler.decide(40.0, Load(40, 0, 6), current=1).replicas == 4


@pytest.mark.parametrize("kwargs", [{"min_replicas": 3, "max_replicas": 2}, {"lag_threshold": 0},
                                    {"max_replicas": 0}, {"scale_down_window_s": -1}])
def test_a_policy_that_cannot_work_is_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        ScalePolicy(**kwargs)


def test_the_scaled_object_carries_the_same_policy_and_sets_the_topic() -> None:
    policy = ScalePolicy(min_replicas=0, max_replicas=6, lag_threshold=8, activation_lag_threshold=2,
                         scale_down_window_s=120)
    obj = scaled_object(policy, name="workers", deployment="specstream-worker", bootstrap_servers="kafka:9092",
                        consumer_group="specstream.engine-workers", topic="specstream.requests")
    trigger = obj["spec"]["triggers"][0]
    assert trigger["type"] == "kafka"
    assert trigger["metadata"] == {
        "bootstrapServers": "kafka:9092", "consumerGroup": "specstream.engine-workers",
        "topic": "specstream.requests", "lagThreshold": "8", "activationLagThreshold": "2",
        "offsetResetPolicy": "earliest", "allowIdleConsumers": "false", "scaleToZeroOnInvalidOffset": "false",
    }
    spec = obj["spec"]
    assert (spec["minReplicaCount"], spec["maxReplicaCount"], spec["cooldownPeriod"]) == (0, 6, 120)
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 120
