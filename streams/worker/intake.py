"""From a validated GenerateRequest to an engine request.

Raw bytes become a :class:`GenerateRequest` (or a precise rejection) in the
foundation (:mod:`streams.service.intake`); what is left here is the engine's
side: the prompt rendered with the model's chat template (:mod:`streams.wire.chat_template`, which the edge
counts with too), the output constraint compiled to a grammar, and the sampling parameters.
"""
from __future__ import annotations

from typing import Any

from engine.grammar.constraint import (
    Constraint,
    ConstraintError,
    ToolFunction,
    json_constraint,
    tool_calls_constraint,
)
from engine.request import EngineRequest, RequestRejected, SamplingOptions
from schemas.events import GenerateRequest
from streams.wire.chat_template import prompt_token_ids


def engine_constraint(request: GenerateRequest) -> Constraint | None:
    """The grammar of the request's constraint; RequestRejected if it does not compile."""
    c = request.constraint
    if c is None:
        return None
    try:
        if c.kind == "json":
            return json_constraint(c.json_schema)
        tools = [ToolFunction(t.name, t.parameters) for t in request.tools or []]
        return tool_calls_constraint(tools, c.tool_choice, c.parallel_tool_calls)
    except ConstraintError as error:
        raise RequestRejected("invalid_request", str(error)) from None


def to_engine_request(request: GenerateRequest, tokenizer: Any, *, arrival_time: float,
                      lora: str | None = None, shared_outputs: bool = False) -> EngineRequest:
    """shared_outputs (engine.speculation.suffix_shared): past outputs draft for every tenant, not only their own."""
    sampling = request.sampling
    return EngineRequest(
        request_id=request.request_id,
        prompt_token_ids=prompt_token_ids(request, tokenizer),
        sampling=SamplingOptions(
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            seed=sampling.seed,
            stop=tuple(sampling.stop),
            ignore_eos=sampling.ignore_eos,
            presence_penalty=sampling.presence_penalty,
            frequency_penalty=sampling.frequency_penalty,
            repetition_penalty=sampling.repetition_penalty,
            min_p=sampling.min_p,
            logit_bias=tuple(sorted(sampling.logit_bias.items())),
            stop_token_ids=tuple(sampling.stop_token_ids),
            min_tokens=sampling.min_tokens,
            logprobs=sampling.logprobs,
            prompt_logprobs=sampling.prompt_logprobs,
        ),
        priority=request.priority,
        deadline=request.deadline,
        speculation=sampling.speculation,
        constraint=engine_constraint(request),
        arrival_time=arrival_time,
        lora=lora,
        draft_scope=draft_scope(request.tenant, shared_outputs),
        keep_output=request.log_prompt,  # a tenant with log_prompts false: its text is kept nowhere
    )


def draft_scope(tenant: str, shared: bool) -> str:
    """The suffix-decoding scope of a tenant's requests: its own, or the shared one ("")."""
    return "" if shared else f"tenant:{tenant}"
