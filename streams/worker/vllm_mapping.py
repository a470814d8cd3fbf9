"""Our engine request and settings in vLLM's terms, field by field, without importing vLLM.

A field vLLM cannot honour the way our engine does is refused (``RequestRejected``, answered with an ErrorEvent
naming it), never dropped. Constraints (response_format, tool_choice) are our llguidance grammars, which vLLM's
``guidance`` structured-output backend enforces with the same library: the same outputs are allowed on both.
Kept free of vLLM imports so the mapping is tested in the main environment; the backend
(``streams.worker.vllm_backend``) feeds these dicts to ``SamplingParams`` and ``EngineArgs``.
"""
from __future__ import annotations

from typing import Any

from engine.config import EngineConfig
from engine.request import EngineRequest, RequestRejected
from streams.worker.vllm_adapters import vllm_max_lora_rank

# vLLM's priority scheduling runs the lower value first, as ours does: our priorities pass unchanged.


def sampling_kwargs(request: EngineRequest, speculates: bool) -> dict[str, Any]:
    """``SamplingParams`` keyword arguments for one request; RequestRejected for what vLLM cannot run as asked.

    ``speculates``: whether the engine was started with a ``speculative_config``."""
    refuse_unmappable(request, speculates)
    s = request.sampling
    kwargs: dict[str, Any] = {
        "n": 1,
        "max_tokens": s.max_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k,  # 0: no top-k filter, in both
        "seed": s.seed,
        "stop": list(s.stop),
        "ignore_eos": s.ignore_eos,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
        "repetition_penalty": s.repetition_penalty,
        "min_p": s.min_p,
        "stop_token_ids": list(s.stop_token_ids),
        "min_tokens": s.min_tokens,
        "logprobs": s.logprobs,
        "prompt_logprobs": s.prompt_logprobs,
        # Stop strings are cut from the text as our engine cuts them; special tokens never reach the text.
        "include_stop_str_in_output": False,
        "skip_special_tokens": True,
    }
    if s.logit_bias:
        kwargs["logit_bias"] = dict(s.logit_bias)
    if request.constraint is not None:  # StructuredOutputsParams' fields
        kwargs["structured_outputs"] = {"grammar": request.constraint.grammar}
    return kwargs


def refuse_unmappable(request: EngineRequest, speculates: bool) -> None:
    """What this backend does not run yet is refused by name (the edge's 400 covers what no backend runs)."""
    if request.speculation is False and speculates:
        # vLLM speculates for every request of an engine or for none; with seeded sampling that changes the text.
        raise RequestRejected("invalid_request", "speculation: false cannot be honoured per request by the vLLM "
                              "backend (it speculates for all requests or none: engine.speculation.enabled)")


def engine_kwargs(config: EngineConfig, model_dir: str, max_model_len_default: int) -> dict[str, Any]:
    """``EngineArgs`` keyword arguments from our engine settings (the same YAML drives both backends).

    ``max_model_len_default`` is what our engine would use for ``engine.max_model_len: null``, so both backends
    accept the same prompts."""
    kwargs: dict[str, Any] = {
        "model": model_dir,
        "dtype": "bfloat16" if config.dtype == "auto" else config.dtype,
        "max_model_len": config.max_model_len or max_model_len_default,
        "max_num_seqs": config.max_running_requests,
        "max_num_batched_tokens": config.max_batched_tokens,
        "enable_prefix_caching": config.prefix_caching,
        "scheduling_policy": "priority",
        # Regenerating a request after a worker crash must give the same text (exactly-once through the edge).
        "seed": 0,
        "enforce_eager": True,
        # StructuredOutputsConfig's fields: our constraints are llguidance's Lark grammars.
        "structured_outputs_config": {"backend": "guidance"},
    }
    if config.kv_cache_bytes is not None:
        kwargs["kv_cache_memory_bytes"] = int(config.kv_cache_bytes)
    else:
        kwargs["gpu_memory_utilization"] = config.kv_cache_fraction
    if config.lora.enabled:  # adapters ride on requests as LoRARequests (streams.worker.vllm_adapters)
        kwargs |= {"enable_lora": True, "max_loras": config.lora.max_loaded,
                   "max_lora_rank": vllm_max_lora_rank(config.lora.max_rank)}
    if config.kv_cache_dtype != "auto":
        kwargs["kv_cache_dtype"] = config.kv_cache_dtype
    spec = speculative_config(config)
    if spec is not None:
        kwargs["speculative_config"] = spec
        if config.lora.enabled:  # vLLM's LoRA kernels want every running sequence's drafts in one step's budget
            needed = config.max_running_requests * (spec["num_speculative_tokens"] + 1)
            kwargs["max_num_batched_tokens"] = max(config.max_batched_tokens, needed)
    return {k: v for k, v in kwargs.items() if v is not None}


def speculative_config(config: EngineConfig) -> dict[str, Any] | None:
    """vLLM's ``speculative_config`` for our ``engine.speculation``; None when speculation is off."""
    spec = config.speculation
    if not spec.enabled:
        return None
    if spec.method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": spec.max_draft_tokens,
                "prompt_lookup_min": spec.ngram_min, "prompt_lookup_max": spec.ngram_max}
    if spec.method == "suffix":  # vLLM's suffix decoding (arctic-inference's trees): the same knobs
        return {"method": "suffix", "num_speculative_tokens": spec.max_draft_tokens,
                "suffix_decoding_max_tree_depth": spec.suffix_max_depth,
                "suffix_decoding_max_spec_factor": spec.suffix_max_spec_factor,
                "suffix_decoding_min_token_prob": spec.suffix_min_token_prob,
                "suffix_decoding_max_cached_requests": spec.suffix_max_outputs}
    if spec.method == "draft" and spec.draft_model:
        return {"model": spec.draft_model, "num_speculative_tokens": spec.max_draft_tokens}
    raise ValueError(f"engine.speculation.method: {spec.method!r} is not mapped onto vLLM's speculative_config "
                     "(ngram, suffix and draft are); set engine.speculation.enabled: false or method: ngram")
