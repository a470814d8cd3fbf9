"""Configuration of speculative decoding (proposers and the adaptive controller).

Kept here rather than in engine/config.py so the speculation package has no
dependency on the engine core; the engine's SpeculationConfig can embed a
SpecConfig or map its fields onto one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SpecMethod = Literal["ngram", "draft"]  # the names engine.config.SpeculationConfig uses
# How a draft model drafts for sampled (temperature > 0) requests; greedy
# requests always draft the argmax.
#   "greedy":  draft argmax q. Deterministic proposal, so the verifier's coupled
#              rule makes the text identical to non-speculative seeded sampling:
#              a redelivered request regenerates the same text whatever draft
#              lengths the controller picks. Acceptance is p(argmax q), which is
#              poor at high temperature.
#   "coupled": draft argmax(q_t / E_t) with the SAME position-keyed noise E_t the
#              target's sample at position t uses. Still deterministic given the
#              prefix and seed, so the same reproducibility as "greedy", and
#              usually much higher acceptance at temperature > 0 (when q == p
#              the draft always matches; in general P(match) >= (1-TV)/(1+TV)).
#   "sampled": draft d ~ q with the draft's own noise, verified with the
#              Leviathan/Chen rejection rule: optimal acceptance 1 - TV(p, q),
#              lossless in distribution, but the text then depends on which
#              positions were drafted, i.e. on the controller's timing-driven
#              draft lengths, so redelivery may produce different text.
DraftSampling = Literal["greedy", "coupled", "sampled"]


@dataclass
class SpecConfig:
    enabled: bool = True
    method: SpecMethod = "ngram"
    max_draft_tokens: int = 8  # k_max: the most drafts per sequence per step

    # n-gram (prompt lookup) proposer: match the last n tokens, n from max down to min.
    ngram_max: int = 4
    ngram_min: int = 1

    # draft-model proposer
    draft_model: str | None = None
    draft_sampling: DraftSampling = "greedy"
    # The draft's own KV arena: an absolute budget in bytes wins over the
    # fraction of free memory; never more than max_running x context is used.
    draft_kv_cache_bytes: int | None = None
    draft_kv_cache_fraction: float = 0.1

    # --- adaptive controller
    # False: every enabled request gets max_draft_tokens (benchmarks, tests).
    adaptive: bool = True
    # Speculation switches off for a request whose acceptance estimate falls
    # below this, once at least min_trials accept tests back the estimate.
    min_acceptance: float = 0.3
    min_trials: float = 8.0
    # Acceptance is estimated from exponentially decayed counts of accept tests
    # (successes / trials), starting from a prior worth prior_weight trials.
    acceptance_prior: float = 0.5
    acceptance_prior_weight: float = 2.0
    acceptance_decay: float = 0.9
    # A switched-off request probes again after probe_interval_steps with a
    # probe_tokens draft; each failed probe doubles the interval, up to max.
    probe_interval_steps: int = 16
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
        if self.max_draft_tokens < 0:
            raise ValueError(f"max_draft_tokens must be >= 0, got {self.max_draft_tokens}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {self.ngram_min}, {self.ngram_max}")
        if self.draft_sampling not in ("greedy", "coupled", "sampled"):
            raise ValueError(f"draft_sampling must be greedy, coupled or sampled, got {self.draft_sampling!r}")
        if self.method not in ("ngram", "draft"):
            raise ValueError(f"method must be ngram or draft, got {self.method!r}")
        if self.enabled and self.method == "draft" and not self.draft_model:
            raise ValueError("speculation method draft needs draft_model (a path or model name)")
        if not 0.0 <= self.min_acceptance < 1.0:
            raise ValueError(f"min_acceptance must be in [0, 1), got {self.min_acceptance}")
        if not 0.0 < self.acceptance_decay <= 1.0 or not 0.0 < self.cost_decay <= 1.0:
            raise ValueError("decays must be in (0, 1]")
        if self.probe_tokens < 1 or self.probe_interval_steps < 1:
            raise ValueError("probe_tokens and probe_interval_steps must be >= 1")

    @classmethod
    def from_engine(cls, speculation_config: object, **overrides: object) -> "SpecConfig":
        """Build from engine.config.SpeculationConfig (or anything with the same
        attribute names): fields both define are copied, the rest keep their
        defaults unless given in overrides. Duck-typed so this package does not
        import the engine's config module."""
        values: dict[str, object] = {}
        for name in cls.__dataclass_fields__:
            if hasattr(speculation_config, name):
                values[name] = getattr(speculation_config, name)
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]
