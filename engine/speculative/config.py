"""Configuration of speculative decoding: the one SpeculationConfig of the engine.

`EngineConfig.speculation` is this class; streams/config.py's SpeculationSettings
validates the user-facing fields and builds it, the fields after those are the
controller's and the draft model's tuning, which only code (tests, benchmarks)
sets. It lives next to the controller and the proposers that read it;
engine.config re-exports it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SpecMethod = Literal["ngram", "draft", "eagle"]
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
class SpeculationConfig:
    # --- user-facing (one SpeculationSettings field each, same names)
    enabled: bool = True
    method: SpecMethod = "ngram"
    # Path or name of the draft model when method == "draft".
    draft_model: str | None = None
    # A trained EAGLE head when method == "eagle": a version folder, a head folder
    # (newest version) or a name under ~/.cache/specstream/draft-heads (engine.speculative.eagle_artifact).
    draft_head: str | None = None
    # Method eagle: prompt lookup (ngram_min..ngram_max) drafts wherever it matches, the head elsewhere.
    eagle_prompt_lookup: bool = True
    # How the draft model drafts for sampled requests (DraftSampling above).
    draft_sampling: DraftSampling = "greedy"
    # k_max: the most drafts per sequence per step; sizes every KV region's draft slack.
    max_draft_tokens: int = 8
    # False: every enabled request gets max_draft_tokens (benchmarks showing a method's ceiling, tests).
    adaptive: bool = True
    # Speculation switches off for a request whose acceptance estimate falls
    # below this (once min_trials accept tests back the estimate)...
    min_acceptance: float = 0.3
    # ...and a switched-off request probes again after this many steps.
    probe_interval_steps: int = 16
    # n-gram (prompt lookup) proposer: match the last n tokens, n from max down to min.
    ngram_min: int = 1
    ngram_max: int = 4

    # --- draft-model proposer tuning
    # The draft's own KV arena: an absolute budget in bytes wins over the
    # fraction of free memory; never more than max_running x context is used.
    draft_kv_cache_bytes: int | None = None
    draft_kv_cache_fraction: float = 0.1

    # --- adaptive controller tuning
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
        if self.max_draft_tokens < 0:
            raise ValueError(f"max_draft_tokens must be >= 0, got {self.max_draft_tokens}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {self.ngram_min}, {self.ngram_max}")
        if self.draft_sampling not in ("greedy", "coupled", "sampled"):
            raise ValueError(f"draft_sampling must be greedy, coupled or sampled, got {self.draft_sampling!r}")
        if self.method not in ("ngram", "draft", "eagle"):
            raise ValueError(f"method must be ngram, draft or eagle, got {self.method!r}")
        if self.enabled and self.method == "draft" and not self.draft_model:
            raise ValueError("speculation method draft needs draft_model (a path or model name)")
        if self.enabled and self.method == "eagle" and not self.draft_head:
            raise ValueError("speculation method eagle needs draft_head (a trained head: specstream draft train)")
        if not 0.0 <= self.min_acceptance < 1.0:
            raise ValueError(f"min_acceptance must be in [0, 1), got {self.min_acceptance}")
        if not 0.0 < self.acceptance_decay <= 1.0 or not 0.0 < self.cost_decay <= 1.0:
            raise ValueError("decays must be in (0, 1]")
        if self.probe_tokens < 1 or self.probe_interval_steps < 1:
            raise ValueError("probe_tokens and probe_interval_steps must be >= 1")
