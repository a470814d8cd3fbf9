"""Adaptive speculation control: draft only where it pays.

Two levels:

per request
    An acceptance estimate a (exponentially decayed counts of accept tests).
    With per-token acceptance a, k drafts yield E(k) = 1 + a + ... + a^k =
    (1 - a^(k+1)) / (1 - a) expected tokens per step. The request's draft length
    maximises E(k) / cost(k), where cost(k) is its share of the step plus the
    marginal cost of its k extra tokens. Below min_acceptance (down to half of it
    where the measured costs say a draft still pays: `off_below`) speculation turns
    off for the request and probes again later with a short draft (interval
    doubling on each failed probe); EngineRequest.speculation False disables it.

global
    A step-cost model, time ~ c0 + c1 * tokens_in_step + cd * drafted, fitted
    online from measured steps. Each step evaluates every global cap K in
    0..k_max (request i drafts min(K, k_i)) and keeps the one with the most
    expected emitted tokens per second for the whole batch. When verification
    is compute-bound (time linear in tokens, c0 small) and acceptance moderate,
    extra tokens cost more than they return and K falls to 0; when the step is
    memory-bound (flat in tokens) and acceptance high, K goes to k_max. Measured,
    not guessed: the decision follows the fitted c0, c1, cd.

Nothing here reads a clock: the engine passes measured times to
`observe_step`, and tests inject a cost model, so decisions are deterministic.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from engine.config import SpeculationConfig
from engine.speculative.config import SpeculationTuning


# ---------------------------------------------------------------- cost models


@dataclass(frozen=True)
class StepCosts:
    fixed_s: float  # c0: seconds per target step regardless of size
    per_token_s: float  # c1: seconds per token fed to the target (decode, draft or prefill)
    draft_per_token_s: float  # cd: proposer seconds per drafted token

    def step_time(self, num_tokens: int, drafted: int) -> float:
        return self.fixed_s + self.per_token_s * num_tokens + self.draft_per_token_s * drafted


class CostModel(Protocol):
    def costs(self) -> StepCosts: ...

    def observe(self, num_tokens: int, elapsed_s: float, draft_s: float, drafted: int) -> None: ...


@dataclass
class FixedCostModel:
    """Costs given up front and never updated (tests, or a calibrated deployment)."""

    fixed_s: float
    per_token_s: float
    draft_per_token_s: float = 0.0

    def costs(self) -> StepCosts:
        return StepCosts(self.fixed_s, self.per_token_s, self.draft_per_token_s)

    def observe(self, num_tokens: int, elapsed_s: float, draft_s: float, drafted: int) -> None:
        pass


class OnlineCostModel:
    """time ~ c0 + c1 * tokens by weighted least squares with exponential forgetting.

    The prior enters as pseudo-observations at two step sizes. They decay like
    real steps, so they only matter until measurements arrive, except for a
    small undecayed floor that keeps the 2x2 system well-posed when every
    recent step had the same size (plain forgetting RLS would "wind up"
    there). Negative fits are clamped: a negative c1 would make huge drafts
    look free.
    The draft cost per drafted token is an EMA of draft_s / drafted.
    """

    _PRIOR_AT = (1.0, 256.0)  # step sizes (tokens) of the prior's pseudo-observations
    _PRIOR_FLOOR = 0.001  # fraction of the prior that never decays

    def __init__(
        self,
        fixed_s: float,
        per_token_s: float,
        prior_weight: float = 1.0,
        decay: float = 0.98,
        draft_decay: float = 0.9,
        draft_per_token_s: float = 0.0,
    ) -> None:
        self._decay = decay
        self._draft_decay = draft_decay
        # Sufficient statistics: the prior starts in the decayed sums (so it fades
        # as real steps arrive) and keeps a small undecayed floor.
        self._s = [0.0] * 5  # decayed sums of w, w*x, w*y, w*x*x, w*x*y
        self._floor = [0.0] * 5  # the same sums for the undecayed part of the prior
        for x in self._PRIOR_AT:
            y = fixed_s + per_token_s * x
            self._add(self._s, x, y, prior_weight)
            self._add(self._floor, x, y, prior_weight * self._PRIOR_FLOOR)
        self._draft_per_token = draft_per_token_s
        self._draft_seen = False
        self._fit = self._solve()

    def observe(self, num_tokens: int, elapsed_s: float, draft_s: float, drafted: int) -> None:
        if num_tokens > 0 and elapsed_s > 0.0:
            self._s = [self._decay * v for v in self._s]
            self._add(self._s, float(num_tokens), elapsed_s, 1.0)
            self._fit = self._solve()
        if drafted > 0 and draft_s >= 0.0:
            per = draft_s / drafted
            if self._draft_seen:
                self._draft_per_token = self._draft_decay * self._draft_per_token + (1 - self._draft_decay) * per
            else:
                self._draft_per_token = per  # the first measurement replaces the prior
                self._draft_seen = True

    def costs(self) -> StepCosts:
        c0, c1 = self._fit
        return StepCosts(c0, c1, self._draft_per_token)

    @staticmethod
    def _add(sums: list[float], x: float, y: float, w: float) -> None:
        sums[0] += w
        sums[1] += w * x
        sums[2] += w * y
        sums[3] += w * x * x
        sums[4] += w * x * y

    def _solve(self) -> tuple[float, float]:
        sw, sx, sy, sxx, sxy = (a + b for a, b in zip(self._s, self._floor))
        det = sw * sxx - sx * sx
        if det > 1e-12 * max(sw * sxx, 1e-300):
            c1 = (sw * sxy - sx * sy) / det
            c0 = (sy - c1 * sx) / sw
        else:
            c1, c0 = 0.0, sy / sw
        if c1 < 0.0:  # flat at best: the mean time
            return sy / sw, 0.0
        if c0 < 0.0:  # through the origin
            return 0.0, sxy / sxx
        return c0, c1


# ---------------------------------------------------------------- per-request state


@dataclass
class SpecState:
    """Speculation state of one request; the engine keeps one on each sequence."""

    request_id: str
    enabled: bool = True  # False: EngineRequest.speculation is False, or speculation is off
    # Decayed accept-test counts; acceptance() blends them with the prior.
    successes: float = 0.0
    trials: float = 0.0
    off: bool = False  # switched off for poor acceptance
    probing: bool = False  # this step's draft is a probe
    next_probe_step: int = 0
    probe_interval: int = 0  # current interval; doubles on each failed probe
    k: int = 0  # draft length planned for the current step (telemetry)
    # Cumulative counters.
    drafted_total: int = 0
    accepted_total: int = 0


def expected_tokens(a: float, k: int) -> float:
    """E(k) = 1 + a + ... + a^k: expected emitted tokens with k drafts at acceptance a."""
    if k <= 0:
        return 1.0
    if a >= 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


@dataclass
class RequestTelemetry:
    request_id: str
    k: int
    acceptance: float
    off: bool
    probing: bool
    drafted: int
    accepted: int


@dataclass
class ControllerTelemetry:
    step: int
    global_cap: int
    costs: StepCosts
    expected_tokens_per_s: float
    requests: list[RequestTelemetry] = field(default_factory=list)


class SpeculationController:
    def __init__(
        self, cfg: SpeculationConfig, cost_model: CostModel | None = None, tuning: SpeculationTuning | None = None
    ) -> None:
        self.cfg = cfg
        self.tuning = tune = tuning or SpeculationTuning()
        self.cost_model: CostModel = cost_model or OnlineCostModel(
            fixed_s=tune.cost_prior_fixed_s,
            per_token_s=tune.cost_prior_per_token_s,
            prior_weight=tune.cost_prior_weight,
            decay=tune.cost_decay,
            draft_decay=tune.draft_cost_decay,
        )
        self.step = 0
        self.global_cap = cfg.max_draft_tokens
        self.expected_tokens_per_s = 0.0

    # ------------------------------------------------------------ state

    def new_state(self, request_id: str, speculation: bool | None = None) -> SpecState:
        """State for a new request; speculation is EngineRequest.speculation (None follows the config)."""
        enabled = self.cfg.enabled and self.cfg.max_draft_tokens > 0 and speculation is not False
        return SpecState(request_id=request_id, enabled=enabled, probe_interval=self.cfg.probe_interval_steps)

    def resting(self, state: SpecState) -> bool:
        """Switched off for poor acceptance, and no probe due at the next plan: it would draft nothing."""
        return state.off and not state.probing and self.step + 1 < state.next_probe_step

    def acceptance(self, state: SpecState) -> float:
        w = self.tuning.acceptance_prior_weight
        return (state.successes + w * self.tuning.acceptance_prior) / (state.trials + w)

    # ------------------------------------------------------------ planning

    def plan(self, states: Sequence[SpecState], base_tokens: int, caps: Sequence[int] | None = None,
             room: int | None = None) -> list[int]:
        """Draft lengths for this step, one per decoding request.

        base_tokens: tokens the step feeds without drafts (prefill chunks plus
        one per decoding sequence). caps: per request the most drafts it may
        verify, each in 0..max_draft_tokens (engine.scheduler.draft_cap decides
        them); None: max_draft_tokens for all. room: the most drafts the step may
        take in all (engine.scheduler.draft_room: a cost step the linear model
        cannot see); None: no such bound. Also sets state.k.
        """
        n = len(states)
        kmax = self.cfg.max_draft_tokens
        cap_of = list(caps) if caps is not None else [kmax] * n
        if len(cap_of) != n or any(not 0 <= c <= kmax for c in cap_of):
            raise ValueError(f"need {n} caps in 0..{kmax}, got {cap_of}")
        self.step += 1

        if not self.cfg.adaptive:
            out = [c if s.enabled else 0 for s, c in zip(states, cap_of)]
            for s, k in zip(states, out):
                s.k = k
            self.global_cap = kmax
            return out
        if n == 0:
            return []

        costs = self.cost_model.costs()
        marginal_s = costs.per_token_s + costs.draft_per_token_s  # one more draft token, fed and drafted
        base_time = max(costs.step_time(base_tokens, 0), 1e-12)
        # Can any draft pay right now? Even a certainly-accepted draft token only
        # pays if its marginal cost is below the time per token of the plain
        # step. When not (compute-bound), probes wait: they could not change
        # the decision.
        can_pay = marginal_s * n < base_time
        limits = [min(self._request_limit(s, kmax, can_pay), c) for s, c in zip(states, cap_of)]
        accs = [self.acceptance(s) for s in states]
        # base_time / n: each request's share of the step it rides in anyway.
        best_k = self._best_lengths(states, accs, limits, base_time / n, marginal_s)
        best_cap, best_tps = self._best_cap(states, accs, best_k, base_tokens, costs, room)
        explore = self.tuning.explore_interval_steps
        if explore and best_cap == 0 and self.step % explore == 0 and room != 0:
            best_cap = 1  # keep the cost model seeing steps with drafts
        self.global_cap = best_cap
        self.expected_tokens_per_s = best_tps

        out: list[int] = []
        for s, k, lim, a in zip(states, best_k, limits, accs):
            s.k = k if s.probing else min(k, best_cap)
            if s.k == 0 and lim > 0 and not s.probing and a < self.cfg.min_acceptance:
                # Drafting is not planned and the estimate is below the floor:
                # switch off now, whatever the evidence count, so that the
                # request enters the probe cycle instead of keeping a frozen
                # estimate (no drafts, no observations) forever.
                self._switch_off(s)
            out.append(s.k)
        excess = sum(out) - room if room is not None else 0
        for i in reversed(range(len(out))):  # probes and the exploring cap within the room, the newest first
            if excess <= 0:
                break
            cut = min(out[i], excess)
            out[i] -= cut
            states[i].k = out[i]
            excess -= cut
        return out

    @staticmethod
    def _best_lengths(
        states: Sequence[SpecState], accs: list[float], limits: list[int], share: float, marginal_s: float
    ) -> list[int]:
        """Per request: the k maximising E(k) / (share + marginal cost of k drafts),
        at least 1 while the request is on: whether a request is worth drafting
        for at all is decided by the global cap and by the acceptance gate.
        Probes keep their length: their point is to measure, not to pay."""
        best_k: list[int] = []
        for s, a, lim in zip(states, accs, limits):
            if s.probing or lim == 0:
                best_k.append(lim)
                continue
            best, best_rate = 1, expected_tokens(a, 1) / (share + marginal_s)
            for k in range(2, lim + 1):
                rate = expected_tokens(a, k) / (share + marginal_s * k)
                if rate > best_rate * (1.0 + 1e-9):  # ties go to the shorter draft
                    best, best_rate = k, rate
            best_k.append(best)
        return best_k

    def _best_cap(
        self, states: Sequence[SpecState], accs: list[float], best_k: list[int], base_tokens: int, costs: StepCosts,
        room: int | None = None,
    ) -> tuple[int, float]:
        """The global cap K (request i drafts min(K, k_i); probes keep theirs) with
        the most expected tokens per second for the batch, and that rate. Caps whose
        drafts exceed the room are not considered (0 always is)."""
        c0, c1, cd = costs.fixed_s, costs.per_token_s, costs.draft_per_token_s
        best_cap, best_tps = 0, -1.0
        for cap in range(0, self.cfg.max_draft_tokens + 1):
            ks = [k if s.probing else min(k, cap) for s, k in zip(states, best_k)]
            drafted = sum(ks)
            if cap > 0 and room is not None and drafted > room:
                break  # a larger cap drafts no less
            time_s = max(c0 + c1 * (base_tokens + drafted) + cd * drafted, 1e-12)
            tps = sum(expected_tokens(a, k) for a, k in zip(accs, ks)) / time_s
            if tps > best_tps * (1.0 + 1e-9):  # ties go to the smaller cap
                best_cap, best_tps = cap, tps
        return best_cap, best_tps

    def _request_limit(self, s: SpecState, kmax: int, can_pay: bool) -> int:
        if not s.enabled:
            return 0
        if not s.off:
            return kmax
        if self.step < s.next_probe_step or not can_pay:
            return 0  # not due, or it could not pay anyway: the probe stays due
        if not s.probing:
            s.probing = True
            # Shrink old evidence so the probe's result can change the estimate.
            keep = self.tuning.probe_memory_trials
            if s.trials > keep:
                scale = keep / s.trials
                s.successes *= scale
                s.trials *= scale
        return min(self.tuning.probe_tokens, kmax)

    def _switch_off(self, s: SpecState) -> None:
        s.off = True
        s.probing = False
        s.next_probe_step = self.step + s.probe_interval

    # ------------------------------------------------------------ feedback

    def observe_acceptance(self, state: SpecState, drafted: int, accepted: int) -> None:
        """After verification: `drafted` draft tokens were proposed, `accepted` accepted.

        The accept tests form a run of successes ended by the first failure, so
        a step is `accepted` successes out of accepted + (1 if a draft was
        rejected) trials; accepted / drafted would underestimate a.
        """
        if drafted <= 0:
            return  # nothing was tested (e.g. no n-gram match): no evidence either way
        if not 0 <= accepted <= drafted:
            raise ValueError(f"accepted must be in [0, drafted={drafted}], got {accepted}")
        d = self.tuning.acceptance_decay
        trials = accepted + (1 if accepted < drafted else 0)
        state.successes = d * state.successes + accepted
        state.trials = d * state.trials + trials
        state.drafted_total += drafted
        state.accepted_total += accepted
        a = self.acceptance(state)
        floor = self.off_below()
        if state.probing:
            state.probing = False
            if a >= floor:
                state.off = False
                state.probe_interval = self.cfg.probe_interval_steps
            else:
                state.probe_interval = min(2 * state.probe_interval, self.tuning.max_probe_interval_steps)
                self._switch_off(state)
        elif not state.off and state.trials >= self.tuning.min_trials and a < floor:
            self._switch_off(state)

    def off_below(self) -> float:
        """The acceptance below which a request stops drafting: min_acceptance, or down to half of it where the
        measured costs say drafting still pays. One draft at acceptance a pays when a > m / t (m: its marginal
        cost, fed and drafted; t: a one-token step): where verification is flat in tokens (bf16, a memory-bound
        step) that is a few percent, and an EAGLE head at 0.25-0.3 was switched off while paying (a third of its
        steps, 54e26a1:docs/benchmarks.md). Never below half: drafts also cost what the model does not see
        (KV slots)."""
        c = self.cost_model.costs()
        step = c.fixed_s + c.per_token_s
        break_even = (c.per_token_s + c.draft_per_token_s) / step if step > 0 else 1.0
        return min(self.cfg.min_acceptance, max(break_even, self.cfg.min_acceptance / 2))

    def observe_step(self, num_tokens: int, elapsed_s: float, draft_s: float = 0.0, drafted: int = 0) -> None:
        """After a step: num_tokens fed to the target (drafts included) took
        elapsed_s for forward + verification; the proposer took draft_s for
        `drafted` draft tokens."""
        self.cost_model.observe(num_tokens, elapsed_s, draft_s, drafted)

    # ------------------------------------------------------------ telemetry

    def telemetry(self, states: Sequence[SpecState] = ()) -> ControllerTelemetry:
        return ControllerTelemetry(
            step=self.step,
            global_cap=self.global_cap,
            costs=self.cost_model.costs(),
            expected_tokens_per_s=self.expected_tokens_per_s,
            requests=[
                RequestTelemetry(
                    request_id=s.request_id,
                    k=s.k,
                    acceptance=self.acceptance(s),
                    off=s.off,
                    probing=s.probing,
                    drafted=s.drafted_total,
                    accepted=s.accepted_total,
                )
                for s in states
            ],
        )
