"""What an answer carries besides its text: per-token logprobs, usage, timings and speculation counts. Parts of
the bus events (schemas.events)."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SpecStepStats(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    drafted: int = Field(default=0, ge=0, description="Draft tokens proposed for this request in this step.")
    accepted: int = Field(default=0, ge=0, description="Draft tokens the target accepted in this step.")


class TopLogprob(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    token_id: int = Field(ge=0)
    token: str = Field(description="The token's text (one token decoded alone).")
    logprob: float = Field(description="Raw log-probability (log_softmax of the model's logits); -9999.0 below that.")


class TokenLogprob(TopLogprob):
    """One generated token's log-probability and the most likely tokens at its position."""

    top: list[TopLogprob] = Field(default_factory=list, description="The sampling.logprobs most likely tokens.")


class PromptLogprob(BaseModel):
    """One prompt token and its log-probability given the tokens before it (none for the first)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    token_id: int = Field(ge=0)
    token: str = Field(description="The token's text (one token decoded alone).")
    logprob: float | None = Field(description="Raw log-probability; null for the first prompt token; -9999.0 floor.")
    top: list[TopLogprob] | None = Field(
        default=None, description="The sampling.prompt_logprobs most likely tokens; null for the first prompt token.")


class PromptTokensDetails(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    cached_tokens: int = Field(
        default=0, ge=0, description="Prompt tokens whose KV the engine's prefix cache already held (not computed).")


class Usage(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    total_tokens: int = Field(ge=0)
    prompt_tokens_details: PromptTokensDetails | None = Field(
        default=None, description="OpenAI's breakdown of the prompt tokens (null from workers before prefix caching).")


class Timings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    queued_s: float = Field(ge=0, description="Publication to first scheduled step.")
    ttft_s: float = Field(ge=0, description="Publication to first token.")
    total_s: float = Field(ge=0, description="Publication to completion.")


class SpecStats(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    drafted: int = Field(default=0, ge=0)
    accepted: int = Field(default=0, ge=0)
    acceptance_rate: float = Field(default=0.0, ge=0, le=1)
    tokens_per_forward: float = Field(default=1.0, ge=0, description="Tokens emitted per target forward pass.")
