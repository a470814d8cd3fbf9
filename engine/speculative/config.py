"""Speculative decoding's tuning: the knobs only code sets (tests, benchmarks), not settings.

The settings users give (method, draft lengths, acceptance floor, ...) are engine.config.SpeculationConfig, the
`engine.speculation` section of the YAML. What is here are the adaptive controller's priors and the draft model's
KV arena: fixed for every deployment, so they stay out of the configuration a user reads.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SpeculationTuning:
    # --- draft-model proposer
    # The draft's own KV arena: an absolute budget in bytes wins over the
    # fraction of free memory; never more than max_running x context is used.
    draft_kv_cache_bytes: int | None = None
    draft_kv_cache_fraction: float = 0.1

    # --- adaptive controller
    # Speculation switches off for a request whose acceptance estimate falls below
    # SpeculationConfig.min_acceptance once min_trials accept tests back the estimate.
    min_trials: float = 8.0
    # Acceptance is estimated from exponentially decayed counts of accept tests
    # (successes / trials), starting from a prior worth prior_weight trials.
    acceptance_prior: float = 0.5
    acceptance_prior_weight: float = 2.0
    acceptance_decay: float = 0.9
    # A probe drafts probe_tokens; each failed probe doubles the interval, up to max.
    max_probe_interval_steps: int = 512
    probe_tokens: int = 2
    # At a probe, old evidence is shrunk to this many trials so the probe counts.
    probe_memory_trials: float = 4.0

    # Step-cost model: time ~ c0 + c1 * tokens_in_step (+ draft cost per drafted
    # token), fitted online with exponential forgetting; these priors are what it
    # believes before any measurement, worth cost_prior_weight observations.
    cost_prior_fixed_s: float = 0.02
    cost_prior_per_token_s: float = 0.0002
    cost_prior_weight: float = 1.0
    cost_decay: float = 0.98
    draft_cost_decay: float = 0.9
    # Every this many steps the global cap is at least 1, so the cost model keeps
    # seeing steps with drafts even while speculation is backed off (0 = never).
    explore_interval_steps: int = 50

    def __post_init__(self) -> None:
        if not 0.0 < self.acceptance_decay <= 1.0 or not 0.0 < self.cost_decay <= 1.0:
            raise ValueError("decays must be in (0, 1]")
        if self.probe_tokens < 1:
            raise ValueError("probe_tokens must be >= 1")
