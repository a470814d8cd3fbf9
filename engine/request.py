"""What the engine is asked to do: one generation request and its sampling parameters.

These are plain dataclasses: validation of user input happens at the edges
(`schemas/`), the engine trusts what it is given apart from the capacity checks
it alone can make (context length, KV budget).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from engine.grammar.constraint import Constraint


@dataclass(frozen=True)
class SamplingOptions:
    """How one request samples. Named apart from the wire's `schemas.events.SamplingParams`,
    which the worker's intake translates into this (the engine never sees wire models)."""

    max_tokens: int = 128
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means no top-k filter
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    # OpenAI's penalties, on generated tokens: logit -= frequency * count + presence * (count > 0).
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # vLLM's / transformers' penalty on every token seen (prompt and generated): positive logits / p, others * p.
    repetition_penalty: float = 1.0
    min_p: float = 0.0  # drop tokens below min_p * the top token's probability (after temperature)
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit)
    stop_token_ids: tuple[int, ...] = ()  # tokens that end generation like EOS (never detokenized)
    min_tokens: int = 0  # EOS and stop_token_ids are masked until this many tokens were generated
    logprobs: int | None = None  # report each emitted token's raw logprob and this many top tokens; None: none
    # Report each prompt token's raw logprob (all but the first) and this many top tokens; None: none. Such a
    # request computes its whole prompt (no prefix-cache hit: cached KV has no logits).
    prompt_logprobs: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def processes_logits(self) -> bool:
        """Whether the logits need engine.logits_processors before sampling (anything beyond temperature/top-k/p)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias or self.min_tokens)


@dataclass
class EngineRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    # Lower value runs first; FCFS within the same priority.
    priority: int = 0
    # Absolute wall-clock deadline (time.time() seconds); None means no deadline.
    deadline: float | None = None
    # None follows the engine's config; False disables speculation for this request.
    speculation: bool | None = None
    # The grammar the output must match (JSON schema, tool calls); None: free text.
    constraint: Constraint | None = None
    # The LoRA adapter (its served name) the request runs with; None: the base model.
    lora: str | None = None
    arrival_time: float = field(default_factory=time.time)
    # Suffix decoding: the scope whose past outputs draft for it and that its output joins (a worker uses the
    # tenant, or "" where the operator shares outputs); keep_output False keeps its output out of every scope.
    draft_scope: str = ""
    keep_output: bool = True


class RequestRejected(Exception):
    """The engine can never serve this request (as opposed to: not yet)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
