"""Events that travel on the bus.

Every event carries `schema_version`; a consumer that sees a version it does not
know dead-letters the message instead of guessing. Models forbid unknown fields
so that a typo in a client is an error naming the field, not a silently ignored
parameter.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from schemas.answer import (
    PromptLogprob,
    SpecStats,
    SpecStepStats,
    Timings,
    TokenLogprob,
    Usage,
)
from schemas.base import SCHEMA_VERSION, Event  # noqa: F401  (SCHEMA_VERSION: consumers import it from here)
from schemas.conversation import ChatMessage, OutputConstraint, ToolCall, ToolSpec  # noqa: F401  (ToolCall too)
from schemas.tools import ToolResult


class SamplingParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_tokens: int = Field(
        default=128, ge=0, le=32768,
        description="Most tokens to generate; 0 computes the prompt only (its prompt_logprobs, an echo).")
    temperature: float = Field(default=0.0, ge=0.0, le=2.0, description="0 is greedy decoding.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    top_k: int = Field(default=0, ge=0, description="Keep only the k most likely tokens; 0 disables the filter.")
    seed: int | None = Field(
        default=None, ge=0, le=2**63 - 1,
        description="Seed of this request's sampler; the edge assigns one when the client gives none so a redelivered request regenerates the same text.",
    )
    stop: list[str] = Field(default_factory=list, max_length=8, description="Strings that end generation; they are not emitted.")
    speculation: bool | None = Field(
        default=None, description="None follows the engine's configuration; false disables speculative decoding for this request."
    )
    presence_penalty: float = Field(
        default=0.0, ge=-2.0, le=2.0, description="OpenAI's: subtracted from the logit of every token generated so far.")
    frequency_penalty: float = Field(
        default=0.0, ge=-2.0, le=2.0,
        description="OpenAI's: times a token's count among the generated tokens, subtracted from its logit.")
    repetition_penalty: float = Field(
        default=1.0, gt=0.0, le=10.0,
        description="vLLM's: tokens of the prompt or generated have positive logits divided by it, others multiplied.")
    min_p: float = Field(
        default=0.0, ge=0.0, le=1.0, description="Drop tokens less likely than min_p times the most likely one.")
    logit_bias: dict[int, float] = Field(
        default_factory=dict, max_length=300, description="Token id -> bias (-100..100) added to its logit.")
    stop_token_ids: list[int] = Field(
        default_factory=list, max_length=64, description="Token ids that end generation like EOS; not in the text.")
    min_tokens: int = Field(
        default=0, ge=0, le=32768, description="EOS and stop_token_ids cannot end generation before this many tokens.")
    ignore_eos: bool = Field(default=False, description="Keep generating past EOS (until max_tokens or a stop).")
    logprobs: int | None = Field(
        default=None, ge=0, le=20,
        description="Report each generated token's log-probability (the model's raw log_softmax, before any "
        "sampling processor) and this many most likely tokens at its position; None: no logprobs.")
    prompt_logprobs: int | None = Field(
        default=None, ge=0, le=20,
        description="vLLM's: report each prompt token's log-probability (raw log_softmax of the model's logits at "
        "the position before it; null for the first token) and this many most likely tokens there, on the first "
        "chunk and the Completion. The prompt is then computed whole (no prefix-cache reuse); None: none.")

    @model_validator(mode="after")
    def _sampling_ranges(self) -> "SamplingParams":
        bad = [t for t, b in self.logit_bias.items() if t < 0 or not -100.0 <= b <= 100.0]
        if bad:
            raise ValueError(f"logit_bias: token {bad[0]} needs an id >= 0 and a bias in [-100, 100]")
        if any(t < 0 for t in self.stop_token_ids):
            raise ValueError("stop_token_ids: token ids are >= 0")
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        return self


class ReplyRoute(BaseModel):
    """Where the worker sends this request's events: a topic and, optionally, one partition of it.

    Each edge owns a reply partition (or topic) and consumes only that, so with
    several edges each receives only its own replies.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    topic: str = Field(min_length=1, max_length=249, description="Reply topic.")
    partition: int | None = Field(default=None, ge=0, description="Reply partition; None lets the key choose.")


class TraceContext(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    traceparent: str | None = Field(default=None, description="W3C traceparent header value.")
    tracestate: str | None = Field(default=None, description="W3C tracestate header value.")


def _exactly_one_input(prompt: str | None, messages: list[ChatMessage] | None) -> None:
    if (prompt is None) == (messages is None):
        raise ValueError("exactly one of 'prompt' and 'messages' must be given")


class GenerateRequest(Event):
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        json_schema_extra={
            "examples": [
                {
                    "schema_version": 1,
                    "request_id": "req-6f1c",
                    "messages": [{"role": "user", "content": "What is Kafka?"}],
                    "model": "smollm2-135m-instruct",
                    "sampling": {"max_tokens": 64, "temperature": 0.0, "seed": 42},
                    "reply_to": {"topic": "specstream.replies", "partition": 3},
                    "tenant": "default",
                }
            ]
        },
    )

    request_id: str = Field(min_length=1, max_length=128, description="Client-unique id; every reply event carries it.")
    prompt: str | None = Field(default=None, description="Raw prompt text (completions API). Exactly one of prompt and messages.")
    prompt_token_ids: list[Annotated[int, Field(ge=0)]] | None = Field(
        default=None, min_length=1,
        description="The prompt as token ids (completions API, a prompt given as ids): the worker feeds them to the "
        "model as they are, untokenized. `prompt` is then their decoded text (the edge adds it, for echo and the logs), "
        "or absent. Not with messages.",
    )
    messages: list[ChatMessage] | None = Field(
        default=None, min_length=1, description="Chat messages, rendered with the model's chat template."
    )
    model: str = Field(min_length=1, description="Name of the served model.")
    sampling: SamplingParams = Field(default_factory=SamplingParams, description="Sampling parameters.")
    reply_to: ReplyRoute = Field(description="Where the reply events go.")
    deadline: float | None = Field(
        default=None, description="Unix time (seconds) after which the request is useless; expired requests are not started."
    )
    priority: int = Field(default=0, ge=-10, le=10, description="Lower runs first; FCFS within a priority.")
    tenant: str = Field(default="default", min_length=1, max_length=64, description="Tenant the request is billed to.")
    trace: TraceContext | None = Field(default=None, description="Trace context propagated from the client.")
    conversation_id: str | None = Field(
        default=None, min_length=1, max_length=128,
        description="The client's conversation (X-Conversation-Id, or prompt_cache_key): during a canary rollout "
        "every request of one conversation goes to the same pool. None: routed by request_id.",
    )
    tools: list[ToolSpec] | None = Field(default=None, description="Functions offered to the model, rendered into the prompt.")
    constraint: OutputConstraint | None = Field(default=None, description="What the output must match; None: free text.")
    created_at: float | None = Field(default=None, description="Unix time the request was published.")
    echo: bool = Field(
        default=False, description="Completions' echo: the answer starts with the prompt (the edge renders it; the "
        "worker ignores it).")
    log_prompt: bool = Field(
        default=True,
        description="False keeps the prompt out of the completions log (the edge sets it from the tenant's "
        "`log_prompts`); such requests cannot be replayed by `specstream eval replay`.",
    )

    @model_validator(mode="after")
    def _exactly_one_input(self) -> "GenerateRequest":
        if self.prompt_token_ids is not None and self.messages is not None:
            raise ValueError("'prompt_token_ids' is a raw prompt: not with 'messages'")
        # Token ids alone are a prompt; with them, `prompt` is only their text.
        text = "" if self.prompt_token_ids is not None and self.prompt is None else self.prompt
        _exactly_one_input(text, self.messages)
        return self


# Why a generation ended: stop (EOS or a stop string), length (max_tokens), abort (cancelled), deadline (its
# deadline passed). The engine's literal (engine.outputs, which cannot import schemas) names the same ones, a unit
# test says so; the edge's chat answers add OpenAI's "tool_calls".
FinishReason = Literal["stop", "length", "abort", "deadline"]


class TokenChunk(Event):
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        json_schema_extra={
            "examples": [
                {"schema_version": 1, "request_id": "req-6f1c", "index": 0, "text": "Kafka is",
                 "token_ids": [42, 7], "spec": {"drafted": 4, "accepted": 1}}
            ]
        },
    )

    type: Literal["chunk"] = "chunk"
    request_id: str
    index: int = Field(ge=0, description="Position of this chunk in the request's stream: 0, 1, 2, ... without gaps.")
    text: str = Field(description="New text; never splits a multi-byte character, never contains a stop string.")
    token_ids: list[int] = Field(description="Tokens produced in this step.")
    finish_reason: FinishReason | None = Field(
        default=None, description="Set on the last chunk only."
    )
    spec: SpecStepStats = Field(default_factory=SpecStepStats, description="Speculation in the step that produced this chunk.")
    draft_chars: int | None = Field(
        default=None, ge=0,
        description="How many leading characters of `text` came from accepted draft tokens (the rest the target "
        "produced); None: not reported (the edge then estimates it from token_ids and spec.accepted).",
    )
    text_offset: int | None = Field(
        default=None, ge=0,
        description="Characters of generated text before this chunk's `text` (its start in the whole answer). "
        "Chunk boundaries depend on timing (adaptive speculation), so after a redelivery the edge deduplicates by "
        "this offset, not by `index`; None: an older worker (the edge falls back to `index`).",
    )
    token_offset: int | None = Field(
        default=None, ge=0, description="Generated tokens before this chunk's `token_ids`; None: not reported.",
    )
    tool_result: ToolResult | None = Field(
        default=None,
        description="A server-side tool call's result (the chunk has no text): the worker ran the call the answer "
        "made, and generation continues with it as a `tool` message; the edge shows it as a `specstream` event.",
    )
    logprobs: list[TokenLogprob] | None = Field(
        default=None, description="One per token of token_ids when the request asked for logprobs; None otherwise.")
    prompt_logprobs: list[PromptLogprob] | None = Field(
        default=None, description="On the first chunk (token_offset 0) of a request that asked for prompt_logprobs: "
        "one per prompt token; None otherwise.")


class Completion(Event):
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        json_schema_extra={
            "examples": [
                {"schema_version": 1, "request_id": "req-6f1c", "text": "Kafka is a log.", "finish_reason": "stop",
                 "num_chunks": 3,
                 "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
                 "timings": {"queued_s": 0.01, "ttft_s": 0.08, "total_s": 0.4}}
            ]
        },
    )

    type: Literal["completion"] = "completion"
    request_id: str
    text: str = Field(description="The whole generated text.")
    finish_reason: FinishReason
    num_chunks: int = Field(ge=0, description="How many TokenChunk events precede this one; lets a client check completeness.")
    usage: Usage
    timings: Timings
    spec: SpecStats = Field(default_factory=SpecStats)
    model: str | None = None
    tool_results: list[ToolResult] = Field(
        default_factory=list, description="Results of the server-side tool calls the answer made, in call order.",
    )
    adapter: str | None = Field(
        default=None, description="The LoRA adapter the request ran with (its served name); null: the base model.")
    logprobs: list[TokenLogprob] | None = Field(
        default=None, description="One per generated token when the request asked for logprobs; None otherwise.")
    prompt_logprobs: list[PromptLogprob] | None = Field(
        default=None, description="One per prompt token when the request asked for prompt_logprobs; None otherwise.")


# What a consumer on the bus may answer with; the worker maps anything else it meets to invalid_request.
BusErrorCode = Literal[
    "invalid_request", "unknown_model", "context_length_exceeded", "deadline_exceeded",
    "cancelled", "overloaded", "internal_error", "unsupported_schema_version", "message_too_large",
]
ErrorCode = Literal[
    BusErrorCode,
    # Raised by the edge itself (never on the bus from a worker): a redelivered request regenerated text that differs
    # from what the client already received, so the stream stops instead of continuing with silently wrong text.
    "regeneration_diverged",
]


class ErrorEvent(Event):
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        json_schema_extra={
            "examples": [
                {"schema_version": 1, "request_id": "req-6f1c", "code": "unknown_model",
                 "message": "model 'gpt-9' is not served; available: smollm2-135m-instruct", "retryable": False}
            ]
        },
    )

    type: Literal["error"] = "error"
    request_id: str | None = Field(description="Id of the failed request, when it could be read.")
    code: ErrorCode
    message: str
    param: str | None = Field(
        default=None, description="The request parameter at fault (e.g. 'max_tokens', 'messages'), when one is; "
        "the edge reports it in OpenAI's error `param`.",
    )
    retryable: bool = False


class CancelRequest(Event):
    """Published by an edge when its client went away; the worker stops and frees the request."""

    type: Literal["cancel"] = "cancel"
    request_id: str
    reason: str = "client disconnected"


# Service kinds every reader of the services topic agrees on (each later consumer adds its own).
ENGINE_WORKER_KIND = "engine-worker"
EDGE_KIND = "edge"


class ServiceAnnouncement(Event):
    """Published by every service on the bus (engine workers, the edge, each consumer) on start, every heartbeat and
    on shutdown, keyed by ``<kind>/<service_id>`` on the compacted services topic. `/readyz`, `specstream status`
    and the autoscaler read it to see every service, whatever its kind."""

    type: Literal["service"] = "service"
    kind: str = Field(min_length=1, max_length=64, description="Service kind, e.g. engine-worker, edge, parser.")
    service_id: str = Field(min_length=1, max_length=256, description="Unique id of this service instance.")
    state: Literal["starting", "ready", "draining", "stopped"] = Field(description="Lifecycle state.")
    host: str = Field(default="", description="Host name the service runs on.")
    pid: int | None = Field(default=None, description="Process id on that host.")
    started_at: float = Field(description="Unix time the service started.")
    in_flight: int = Field(default=0, ge=0, description="Messages (requests) held and not yet answered.")
    models: list[str] = Field(default_factory=list, description="Models served (engine workers).")
    adapters: dict[str, str] = Field(
        default_factory=dict, description="LoRA adapters served (each also in models): name -> its base model.")
    adapter_errors: dict[str, str] = Field(
        default_factory=dict, description="Recent failed adapter loads here: the load command's id -> why.")
    metrics_url: str | None = Field(default=None, description="Where the service's Prometheus metrics are served.")
    at: float = Field(description="Unix time of this announcement.")


class RolloutState(Event):
    """The state of a canary rollout of one model, keyed by the model's name on the compacted rollouts topic.

    Written by ``specstream rollout start`` at every step and outcome, and by ``rollout pause|resume|abort``; every
    edge follows it and sends ``percent`` % of new requests (by a stable hash of the request id) to the candidate
    pool's request topic ``<candidate_prefix>.requests``."""

    type: Literal["rollout"] = "rollout"
    model: str = Field(min_length=1, description="The model name both pools serve.")
    rollout_id: str = Field(min_length=1, max_length=64)
    candidate: str = Field(default="", description="What the candidate is (its configuration file), for people.")
    candidate_prefix: str = Field(min_length=1, pattern=r"^[a-zA-Z0-9._-]+$",
                                  description="Topic prefix of the candidate pool (its requests, cancellations).")
    state: Literal["starting", "running", "paused", "completed", "rolled_back", "aborted"]
    percent: float = Field(ge=0, le=100, description="Share of new requests sent to the candidate.")
    steps: list[float] = Field(default_factory=list, description="The planned percentages.")
    step: int = Field(default=0, ge=0, description="Index of the current step in steps.")
    reason: str = Field(default="", description="Why the rollout is in this state (the failed gate, who aborted).")
    at: float = Field(description="Unix time of this state.")
    controller_host: str = Field(default="", description="Host of the `specstream rollout start` process stepping it.")
    controller_pid: int | None = Field(
        default=None, description="That process's id: it owns the candidate workers it started, and drains them when "
        "the rollout ends (`rollout abort`, a failed gate, or a SIGINT/SIGTERM to it).")
    local_workers: int = Field(
        default=0, ge=0, description="Candidate workers that process started on its host (0: the candidate pool runs "
        "elsewhere, e.g. a Deployment its operator owns).")


class EdgeAnnouncement(Event):
    """Published by each edge on start and every minute; `specstream topics gc` keeps the reply topics of edges
    announced recently and deletes those of edges gone for longer."""

    type: Literal["edge"] = "edge"
    edge_id: str
    reply_topic: str
    at: float


ReplyEvent = Annotated[TokenChunk | Completion | ErrorEvent, Field(discriminator="type")]


class DeadLetter(Event):
    """A message a consumer could not process, kept with its original bytes so it can be re-driven."""

    type: Literal["dead_letter"] = "dead_letter"
    reason: str = Field(description="Why the message was rejected, naming the field or limit.")
    source_topic: str
    source_partition: int = Field(ge=0)
    source_offset: int = Field(ge=0)
    original_b64: str = Field(description="The original message value, base64.")
    original_key_b64: str | None = None
    consumer: str = Field(description="Which consumer rejected it (worker id).")
    at: float
    undelivered: str | None = Field(
        default=None,
        description="For reply_undeliverable: the final reply event (JSON) that could not be delivered to the "
        "request's reply topic; the original is the request, so a redrive generates the answer again.",
    )


class CompletionRecord(Event):
    """One finished request, published once by the worker that answered it (after its final reply event was
    acknowledged) to ``<prefix>.completions``, keyed by request_id. What `specstream eval` replays and draft training
    reads. A request regenerated after a redelivery may be recorded twice: readers deduplicate by request_id."""

    type: Literal["completion_record"] = "completion_record"
    request_id: str = Field(description="Id of the recorded request.")
    tenant: str = Field(description="Tenant the request was billed to.")
    model: str = Field(description="Model the request asked for.")
    sampling: SamplingParams = Field(description="Sampling parameters as received (seed included), even without the prompt.")
    request: GenerateRequest | None = Field(
        description="The request as received; None when its prompt was not to be logged (log_prompt false)."
    )
    completion: Completion | None = Field(
        default=None, description="The final Completion (text, finish reason, usage, timings, speculation stats)."
    )
    error: ErrorEvent | None = Field(default=None, description="The ErrorEvent, when the request failed after it started.")
    served_model: str | None = Field(default=None, description="Name of the model the engine served it with.")
    worker_id: str = Field(description="Worker that answered it.")
    config_fingerprint: str = Field(description="Stable hash of the worker's engine settings (model, dtype, speculation, ...).")
    recorded_at: float = Field(description="Unix time the record was published.")

    @model_validator(mode="after")
    def _exactly_one_outcome(self) -> "CompletionRecord":
        if (self.completion is None) == (self.error is None):
            raise ValueError("exactly one of 'completion' and 'error' must be given")
        return self


class EvalSample(Event):
    """One evaluation item on ``<prefix>.eval-samples``: an input, optionally the answer it should get, and tags."""

    type: Literal["eval_sample"] = "eval_sample"
    sample_id: str = Field(min_length=1, max_length=128, description="Id of the sample, unique within its set.")
    prompt: str | None = Field(default=None, description="Raw prompt text. Exactly one of prompt and messages.")
    messages: list[ChatMessage] | None = Field(default=None, min_length=1, description="Chat messages.")
    reference: str | None = Field(default=None, description="The expected answer, for exact match and token F1.")
    tags: list[str] = Field(default_factory=list, description="Labels to break scores down by (task, language, ...).")

    @model_validator(mode="after")
    def _exactly_one_input(self) -> "EvalSample":
        _exactly_one_input(self.prompt, self.messages)
        return self
