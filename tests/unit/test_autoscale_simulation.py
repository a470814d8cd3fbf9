"""The scaling simulation: conservation, the queueing basics, and the trade the autoscaler makes."""
from __future__ import annotations

import math

from streams.ops.scaling import ScalePolicy
from streams.ops.simulation import Simulation, TraceShape, WorkerModel, arrivals

MODEL = WorkerModel(slots=8, service_s=4.0, start_s=30.0, rebalance_s=3.0)  # 2 requests/s per worker
HOUR = TraceShape(duration_s=3600, period_s=3600, trough_rps=0.5, peak_rps=8.0, bursts=2, burst_requests=100,
                  seed=7)


def test_arrivals_follow_the_curve_and_the_seed() -> None:
    times = arrivals(HOUR)
    assert times == sorted(times) == arrivals(HOUR)
    mean_rate = (HOUR.trough_rps + HOUR.peak_rps) / 2
    expected = mean_rate * HOUR.duration_s + HOUR.bursts * HOUR.burst_requests
    assert abs(len(times) - expected) < 4 * math.sqrt(expected)
    # The curve: the middle of the period (its peak) is busier than its first tenth (its trough).
    assert sum(1500 < t < 2100 for t in times) > 5 * sum(0 < t < 600 for t in times)


def test_below_capacity_every_request_takes_its_service_time() -> None:
    times = [i * 0.75 for i in range(400)]  # 1.33 req/s against 2 req/s
    outcome = Simulation(MODEL, slo_s=10, partitions=4).run("fixed", times, fixed=1)
    assert outcome.requests == 400 and outcome.good == 400
    assert outcome.p99_s <= MODEL.service_s + 1.0


def test_above_capacity_the_queue_grows_and_the_slo_is_missed() -> None:
    times = [i * 0.25 for i in range(1200)]  # 4 req/s against 2 req/s for 5 minutes
    outcome = Simulation(MODEL, slo_s=10, partitions=4).run("fixed", times, fixed=1)
    assert outcome.requests == 1200 and outcome.good_share < 0.2


def test_the_autoscaler_meets_the_slo_with_fewer_worker_minutes_than_peak_provisioning() -> None:
    times = arrivals(HOUR)
    sim = Simulation(MODEL, slo_s=30, partitions=8, poll_s=5)
    peak = sim.run("peak", times, fixed=math.ceil(HOUR.peak_rps / MODEL.capacity_rps) + 1)
    scaled = sim.run("auto", times, policy=ScalePolicy(1, 8, lag_threshold=MODEL.slots, scale_down_window_s=60))
    assert scaled.requests == peak.requests == len(times)  # every request answered, once
    assert scaled.worker_minutes < 0.9 * peak.worker_minutes
    assert scaled.good_share > 0.95 and scaled.scale_events > 2
