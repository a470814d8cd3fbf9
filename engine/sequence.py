"""Per-request state inside the engine."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.detokenizer import IncrementalDetokenizer
from engine.kv_cache import CacheSlot, region_size
from engine.outputs import FinishReason, RequestStats, SpecTally
from engine.request import EngineRequest, SamplingOptions
from engine.sampler import RequestRng
from engine.speculative.controller import SpecState

if TYPE_CHECKING:
    import torch
    from llguidance import LLMatcher

    from engine.logprobs import LogprobEntry


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # queued, holds no KV memory
    RUNNING = "running"  # holds a KV region; prefilling or decoding
    FINISHED = "finished"  # left the engine; region freed


@dataclass
class Sequence:
    request: EngineRequest
    output_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    kv: CacheSlot | None = None
    finish_reason: FinishReason | None = None
    # Whether this sequence drafts at all (request opt-out or engine-wide off).
    speculate: bool = False
    # The speculation controller's per-sequence state (None without speculation).
    spec_state: SpecState | None = None
    # With a proposer of several sources (DraftSources): a state per source; spec_state is the one of the
    # source drafting this step (the engine picks it before planning).
    spec_states: dict[str, SpecState] = field(default_factory=dict)
    # Position-keyed sampling randomness and the incremental detokenizer: the
    # engine sets both in add_request (scheduler tests run without them).
    rng: RequestRng | None = None
    detok: IncrementalDetokenizer | None = None
    # The grammar's state after output_ids, for a constrained request (engine.grammar.matchers).
    matcher: LLMatcher | None = None

    # Prefix caching (engine.prefix_cache): the chained hashes of the full blocks hashed so far, the root of the
    # chain (the inputs besides tokens that change KV: the LoRA adapter), and the prompt tokens whose KV the
    # first admission found cached (None until admitted).
    block_hashes: list[bytes] = field(default_factory=list)
    cache_salt: str = ""
    num_cached_prompt_tokens: int | None = None
    # A request asking for prompt logprobs: one entry per prompt token after the first, recorded chunk by chunk as
    # the prefill computes them (engine.runner); the first output carries them.
    prompt_logprobs: list[LogprobEntry] = field(default_factory=list)
    # Times this sequence gave its KV region back for a more urgent one (recomputed when it runs again).
    num_preemptions: int = 0
    # After a preemption, until it is put back: the KV of its output positions (every layer), kept outside the
    # arena, because recomputing them with the chunk kernel rounds differently from the decodes that wrote them.
    saved_output_kv: torch.Tensor | None = None

    # Timing (time.time()) and counters for RequestStats.
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    # Target forwards that produced tokens for this sequence (prefill chunks that
    # end mid-prompt do not count), so tokens_per_forward is 1.0 without speculation.
    num_sampling_forwards: int = 0
    spec: SpecTally = field(default_factory=SpecTally)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def params(self) -> SamplingOptions:
        return self.request.sampling

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.request.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.request.prompt_token_ids) + len(self.output_ids)

    @property
    def num_computed(self) -> int:
        """Tokens whose KV is in the cache."""
        return self.kv.num_cached if self.kv is not None else 0

    @property
    def prefill_target(self) -> int:
        """Tokens to compute before the next decode: the prompt (also after a preemption, whose output's KV is
        put back once the prompt is computed), or every token but the last sampled one (which the next decode
        feeds) once it has output."""
        if not self.output_ids or self.saved_output_kv is not None:
            return self.num_prompt_tokens
        return self.num_tokens - 1

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed < self.prefill_target

    @property
    def wants_prompt_rows(self) -> bool:
        """Asked for prompt logprobs and does not have them all yet: its prefill must compute (not reuse) the prompt."""
        return self.params.prompt_logprobs is not None and len(self.prompt_logprobs) < self.num_prompt_tokens - 1

    @property
    def last_token(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.request.prompt_token_ids[-1]

    def token_ids(self, start: int, end: int) -> list[int]:
        """Tokens [start, end) of prompt + output."""
        n_prompt = self.num_prompt_tokens
        if end <= n_prompt:
            return self.request.prompt_token_ids[start:end]
        return (self.request.prompt_token_ids + self.output_ids)[start:end]

    def all_token_ids(self) -> list[int]:
        return self.request.prompt_token_ids + self.output_ids

    def kv_tokens_needed(self, max_draft_tokens: int) -> int:
        """Region size reserved on admission: enough for the sequence's whole life."""
        draft = max_draft_tokens if self.speculate else 0
        return region_size(self.num_prompt_tokens + self.params.max_tokens, draft)

    def stats(self) -> RequestStats:
        arrival = self.request.arrival_time
        end = self.finish_time if self.finish_time is not None else arrival
        first_sched = self.first_scheduled_time if self.first_scheduled_time is not None else end
        first_tok = self.first_token_time if self.first_token_time is not None else end
        n_out = len(self.output_ids)
        return RequestStats(
            prompt_tokens=self.num_prompt_tokens,
            completion_tokens=n_out,
            queued_s=max(0.0, first_sched - arrival),
            ttft_s=max(0.0, first_tok - arrival),
            total_s=max(0.0, end - arrival),
            spec=self.spec.copy(),
            tokens_per_forward=n_out / self.num_sampling_forwards if self.num_sampling_forwards else 1.0,
            cached_prompt_tokens=self.num_cached_prompt_tokens or 0,
            preemptions=self.num_preemptions,
        )
