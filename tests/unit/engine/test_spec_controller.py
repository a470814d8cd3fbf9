"""engine.speculative.controller: per-request acceptance control and the global cost model."""
from __future__ import annotations

from dataclasses import fields

import pytest

from engine.config import SpeculationConfig
from engine.speculative.config import SpeculationTuning
from engine.speculative.controller import (
    CostModel,
    FixedCostModel,
    OnlineCostModel,
    SpecState,
    SpeculationController,
    expected_tokens,
)


TUNING = {f.name for f in fields(SpeculationTuning)}


def cfg(**kw: object) -> SpeculationConfig:
    return SpeculationConfig(**{"max_draft_tokens": 6, **kw})  # type: ignore[arg-type]


def controller(cost_model: CostModel | None = None, **kw: object) -> SpeculationController:
    """A controller for k_max 6 that never explores on its own, with the given settings and tuning."""
    tuning = {"explore_interval_steps": 0, **{k: v for k, v in kw.items() if k in TUNING}}
    settings = cfg(**{k: v for k, v in kw.items() if k not in TUNING})
    return SpeculationController(settings, cost_model, SpeculationTuning(**tuning))  # type: ignore[arg-type]


def feed(ctl: SpeculationController, states: list[SpecState], rate: float, steps: int) -> None:
    """Steps where each request accepts its drafts at exactly `rate` on average."""
    for _ in range(steps):
        ks = ctl.plan(states, base_tokens=len(states))
        for s, k in zip(states, ks):
            if k:
                # Deterministic "acceptance rate": accept round(rate * k) of k.
                ctl.observe_acceptance(s, k, min(k, round(rate * k)))


def test_expected_tokens_per_step_grow_with_acceptance_and_draft_length() -> None:
    assert expected_tokens(0.5, 0) == 1.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.0, 5) == 1.0


def test_poor_acceptance_drives_k_down_then_off_then_probes() -> None:
    # A step cost with a per-token part, so k trades off against acceptance.
    ctl = controller(FixedCostModel(0.01, 0.002), probe_interval_steps=10, probe_tokens=2)
    s = ctl.new_state("r")
    ks: list[int] = []
    while not s.off:
        [k] = ctl.plan([s], base_tokens=1)
        ks.append(k)
        ctl.observe_acceptance(s, k, 0)  # every draft rejected
        assert len(ks) < 100
    assert ks[0] > 1 and ks == sorted(ks, reverse=True) and ks[-1] < ks[0]
    off_at = ctl.step
    # Off: no drafts until the probe is due.
    for _ in range(9):
        assert ctl.plan([s], base_tokens=1) == [0]
    assert ctl.plan([s], base_tokens=1) == [2] and s.probing
    assert ctl.step == off_at + 10
    ctl.observe_acceptance(s, 2, 0)  # the probe fails: off again, twice as long
    assert s.off and not s.probing and s.probe_interval == 20
    for _ in range(19):
        assert ctl.plan([s], base_tokens=1) == [0]
    assert ctl.plan([s], base_tokens=1) == [2]
    ctl.observe_acceptance(s, 2, 2)  # the text changed: the probe succeeds
    assert not s.off and s.probe_interval == 10
    [k] = ctl.plan([s], base_tokens=1)
    assert k >= 1


def test_probe_without_a_proposal_stays_due() -> None:
    ctl = controller(FixedCostModel(0.01, 0.0), probe_interval_steps=3)
    s = ctl.new_state("r")
    s.off, s.next_probe_step = True, 2
    assert ctl.plan([s], 1) == [0]
    assert ctl.plan([s], 1) == [2]
    ctl.observe_acceptance(s, 0, 0)  # e.g. no n-gram match: nothing tested
    assert ctl.plan([s], 1) == [2] and s.probing


def test_per_request_override_and_disabled_config() -> None:
    ctl = controller(FixedCostModel(0.02, 0.0))
    on, off = ctl.new_state("a"), ctl.new_state("b", speculation=False)
    assert ctl.plan([on, off], 2) == [6, 0]
    ctl = controller(FixedCostModel(0.02, 0.0), enabled=False)
    assert ctl.plan([ctl.new_state("a")], 1) == [0]


def test_caps_bound_the_draft() -> None:
    ctl = controller(FixedCostModel(0.02, 0.0))
    states = [ctl.new_state("a"), ctl.new_state("b")]
    assert ctl.plan(states, 2, caps=[2, 0]) == [2, 0]


def test_the_drafts_of_a_step_stay_within_its_room_however_cheap_the_cost_model_says_they_are() -> None:
    ctl = controller(FixedCostModel(fixed_s=0.03, per_token_s=0.0))  # flat: drafts look free
    states = [ctl.new_state(f"r{i}") for i in range(4)]
    assert ctl.plan(states, base_tokens=4, room=9) == [2, 2, 2, 2]  # the largest cap within the room
    assert ctl.plan(states, base_tokens=4, room=0) == [0] * 4
    assert ctl.plan(states, base_tokens=4, room=None) == [6] * 4


def test_probes_and_exploration_stay_within_the_room_too() -> None:
    ctl = controller(FixedCostModel(0.01, 0.0), probe_interval_steps=3, probe_tokens=3)
    probes = [ctl.new_state("a"), ctl.new_state("b")]
    for s in probes:
        s.off, s.next_probe_step = True, 1
    assert ctl.plan(probes, 2, room=4) == [3, 1] and [s.k for s in probes] == [3, 1]
    explorer = controller(FixedCostModel(0.0, 1.0), explore_interval_steps=1)  # drafts never pay: only exploring
    assert explorer.plan([explorer.new_state("a")], 1, room=1) == [1]
    assert explorer.plan([explorer.new_state("a")], 1, room=0) == [0]


def test_compute_bound_moderate_acceptance_turns_speculation_off() -> None:
    # Verification cost linear in tokens, no fixed part to amortise: every draft
    # token costs as much as a real one and is only accepted 60% of the time.
    ctl = controller(FixedCostModel(fixed_s=0.0005, per_token_s=0.001))
    states = [ctl.new_state(f"r{i}") for i in range(32)]
    feed(ctl, states, rate=0.6, steps=30)
    assert ctl.plan(states, base_tokens=32) == [0] * 32
    assert ctl.global_cap == 0


def test_memory_bound_high_acceptance_drafts_the_most() -> None:
    # Flat step cost (memory-bound decoding): drafts ride along for free.
    ctl = controller(FixedCostModel(fixed_s=0.03, per_token_s=0.0))
    states = [ctl.new_state(f"r{i}") for i in range(4)]
    feed(ctl, states, rate=0.9, steps=30)
    assert ctl.plan(states, base_tokens=4) == [6] * 4
    assert ctl.global_cap == 6


def test_heterogeneous_acceptance_gets_different_k() -> None:
    ctl = controller(FixedCostModel(fixed_s=0.02, per_token_s=0.001))
    good, poor = ctl.new_state("good"), ctl.new_state("poor")
    for _ in range(30):
        ctl.observe_acceptance(good, 6, 6)
        ctl.observe_acceptance(poor, 4, 1)
    kg, kp = ctl.plan([good, poor], base_tokens=2)
    assert kg > kp


def test_online_cost_model_fits_linear_steps() -> None:
    model = OnlineCostModel(fixed_s=0.05, per_token_s=0.0, decay=0.98)
    for i in range(200):
        tokens = 8 + (i * 37) % 120
        model.observe(tokens, 0.004 + 0.0003 * tokens, draft_s=0.0006 * 3, drafted=3)
    c = model.costs()
    assert c.fixed_s == pytest.approx(0.004, rel=0.05)
    assert c.per_token_s == pytest.approx(0.0003, rel=0.02)
    assert c.draft_per_token_s == pytest.approx(0.0006)


def test_online_cost_model_stays_sane_without_variation() -> None:
    model = OnlineCostModel(fixed_s=0.01, per_token_s=0.0001)
    for _ in range(500):
        model.observe(64, 0.02, 0.0, 0)
    c = model.costs()
    assert c.fixed_s >= 0 and c.per_token_s >= 0
    assert c.step_time(64, 0) == pytest.approx(0.02, rel=0.02)


def test_measured_roofline_backs_off_at_large_batch() -> None:
    """Closed loop with the online model: step time = max(flat, linear) like a
    GPU roofline. Small batches stay memory-bound (speculate), large batches
    become compute-bound (stop), purely from measured step times."""

    def step_time(tokens: int) -> float:
        return max(0.02, 0.0004 * tokens)  # knee at 50 tokens

    def run(batch: int) -> int:
        ctl = controller(explore_interval_steps=10)
        states = [ctl.new_state(f"r{i}") for i in range(batch)]
        for _ in range(155):  # ends away from an exploration step (every 10th)
            ks = ctl.plan(states, base_tokens=batch)
            drafted = sum(ks)
            ctl.observe_step(batch + drafted, step_time(batch + drafted), 0.0, drafted)
            for s, k in zip(states, ks):
                if k:
                    ctl.observe_acceptance(s, k, round(0.7 * k))
        return ctl.global_cap

    assert run(4) >= 3
    assert run(256) == 0


def test_without_adaptation_every_sequence_drafts_the_maximum() -> None:
    ctl = controller(FixedCostModel(0.0, 1.0), adaptive=False)
    assert ctl.plan([ctl.new_state("a")], 1) == [6]


def test_telemetry_reports_the_cap_the_costs_and_each_requests_acceptance() -> None:
    ctl = controller(FixedCostModel(0.02, 0.001, 0.0005))
    s = ctl.new_state("a")
    [k] = ctl.plan([s], 1)
    ctl.observe_acceptance(s, k, 1)
    tel = ctl.telemetry([s])
    assert tel.global_cap == ctl.global_cap and tel.step == 1
    assert tel.costs.per_token_s == 0.001 and tel.costs.draft_per_token_s == 0.0005
    [r] = tel.requests
    assert (r.request_id, r.k, r.drafted, r.accepted) == ("a", k, k, 1)
    assert 0 < r.acceptance < 1


def test_invalid_observations_are_refused() -> None:
    ctl = controller(FixedCostModel(0.02, 0.0))
    with pytest.raises(ValueError):
        ctl.observe_acceptance(ctl.new_state("a"), 2, 3)
    with pytest.raises(ValueError):
        ctl.plan([ctl.new_state("a")], 1, caps=[1, 2])
    with pytest.raises(ValueError, match="caps in 0..6"):  # draft_cap never gives more than k_max
        ctl.plan([ctl.new_state("a")], 1, caps=[7])


def test_free_drafts_still_switch_off_on_evidence() -> None:
    # Flat cost: k stays at max while the estimate is uncertain, then the
    # acceptance gate switches the request off once min_trials back it.
    ctl = controller(FixedCostModel(0.02, 0.0))
    s = ctl.new_state("r")
    ks: list[int] = []
    while not s.off:
        [k] = ctl.plan([s], 1)
        ks.append(k)
        ctl.observe_acceptance(s, k, 0)
        assert len(ks) < 100
    assert set(ks) == {6} and s.trials >= ctl.tuning.min_trials


def _accepting_one_draft_in_four(ctl: SpeculationController) -> SpecState:
    """A request whose first draft is accepted one step in four (estimate ~0.25, under min_acceptance 0.3)."""
    s = ctl.new_state("r")
    for step in range(60):
        [k] = ctl.plan([s], 1)
        if k:
            ctl.observe_acceptance(s, k, 1 if step % 4 == 0 else 0)
    return s


def test_a_request_whose_drafts_still_pay_keeps_drafting_under_min_acceptance() -> None:
    # Flat verification, a draft costing 2 % of the step: at 0.25 a draft pays, so the gate stays open.
    paying = _accepting_one_draft_in_four(controller(FixedCostModel(0.02, 0.0, 0.0004)))
    assert not paying.off and paying.drafted_total >= 60
    # The same acceptance where a draft costs a third of the step (it pays from 0.33): drafting stops within a few
    # steps, and the gate stays at min_acceptance.
    ctl = controller(FixedCostModel(0.02, 0.004, 0.004))
    costly = _accepting_one_draft_in_four(ctl)
    assert costly.drafted_total <= 10 and costly.k == 0 and ctl.off_below() == cfg().min_acceptance
    # However cheap the drafts, never below half of min_acceptance (free drafts still switch off, above).
    assert controller(FixedCostModel(0.02, 0.0)).off_below() == cfg().min_acceptance / 2


def test_probes_wait_while_no_draft_could_pay() -> None:
    ctl = controller(FixedCostModel(fixed_s=0.0, per_token_s=0.001), probe_interval_steps=2)
    s = ctl.new_state("r")
    s.off, s.next_probe_step = True, 1
    for _ in range(5):
        assert ctl.plan([s], 1) == [0]  # compute-bound: a probe could not change anything
    ctl.cost_model = FixedCostModel(fixed_s=0.02, per_token_s=0.0)
    assert ctl.plan([s], 1) == [2]  # the due probe runs once drafts can pay
