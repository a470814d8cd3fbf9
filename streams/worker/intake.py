"""From a validated GenerateRequest to an engine request.

Raw bytes become a :class:`GenerateRequest` (or a precise rejection) in the
foundation (:mod:`streams.service.intake`); what is left here is the engine's
side: rendering the prompt with the model's tokenizer and the sampling
parameters.
"""
from __future__ import annotations

from typing import Any

from engine.request import EngineRequest, SamplingOptions
from schemas.events import GenerateRequest
from streams.worker.tools import engine_constraint, template_messages


def prompt_token_ids(request: GenerateRequest, tokenizer: Any) -> list[int]:
    """Chat messages go through the model's chat template; a raw prompt is tokenized as is."""
    if request.messages is not None:
        if not getattr(tokenizer, "chat_template", None):  # a base model: never another model's template
            raise ValueError("this model has no chat template (a base model): send a raw prompt to /v1/completions")
        messages, template_kwargs = template_messages(request, tokenizer)
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **template_kwargs)
        # The template already contains the special tokens the model expects.
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        ids = tokenizer(request.prompt)["input_ids"]
    return list(ids)


def to_engine_request(request: GenerateRequest, tokenizer: Any, *, arrival_time: float,
                      lora: str | None = None) -> EngineRequest:
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
    )
