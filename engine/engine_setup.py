"""The parts of an LLMEngine its config decides, built once at start: served length, KV arena, proposer, adapters.

Kept apart from engine.llm_engine so that the engine module reads as what a
step does; nothing here runs after construction.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from engine.config import EngineConfig, LoRAConfig, SpeculationConfig
from engine.kv_cache import KVCache, kv_budget_bytes, region_size
from engine.loader import LoadedModel
from engine.lora.manager import LoRAManager
from engine.quant.formats import REDUCED_FORMATS
from engine.speculative.proposer import Proposer

if TYPE_CHECKING:
    from engine.speculative.suffix import SuffixProposer

Progress = Callable[[str], None]


def no_progress(_: str) -> None:
    pass


def resolve_max_model_len(requested: int | None, context: int) -> int:
    """The longest prompt + completion served: as configured, or min(model context, 2048)."""
    if requested is None:
        return min(context, 2048)
    if requested > context:
        raise ValueError(f"max_model_len {requested} exceeds the model's context of {context} tokens")
    return requested


KV_CACHE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
REDUCED_WEIGHTS = REDUCED_FORMATS  # the formats whose KV is bfloat16 under kv_cache_dtype auto


def kv_cache_dtype(setting: str, model_dtype: torch.dtype, weight_format: str) -> torch.dtype:
    """The KV arena's element type for engine.kv_cache_dtype. auto: bfloat16 beside reduced-precision weights, where
    fp32 K and V would be a third of the bytes a long-context step reads; the model's dtype with fp32 weights."""
    if setting == "auto":
        return torch.bfloat16 if weight_format in REDUCED_WEIGHTS else model_dtype
    if setting not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be auto, float32 or bfloat16, got {setting!r}")
    return KV_CACHE_DTYPES[setting]


def build_kv_cache(
    loaded: LoadedModel, config: EngineConfig, max_len: int, max_draft_tokens: int, weight_format: str
) -> KVCache:
    cfg = loaded.model.cfg
    budget = kv_budget_bytes(loaded.device, config.kv_cache_bytes, config.kv_cache_fraction)
    # More than every running sequence at full length could never be used.
    useful = config.max_sequences * region_size(max_len, max_draft_tokens)
    dtype = kv_cache_dtype(config.kv_cache_dtype, loaded.dtype, weight_format)
    return KVCache.from_budget(
        budget, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, dtype, loaded.device, max_tokens=useful
    )


def build_proposer(loaded: LoadedModel, config: EngineConfig, max_len: int, say: Progress) -> Proposer:
    spec = config.speculation
    if spec.method == "ngram":
        from engine.speculative.ngram import NgramProposer

        return NgramProposer(spec.ngram_min, spec.ngram_max)
    if spec.method == "suffix":
        return build_suffix_proposer(spec)
    if spec.method == "draft":
        from engine.speculative.draft_model import DraftModelProposer

        say(f"loading draft model {spec.draft_model} ...")
        return DraftModelProposer.from_engine(
            spec,
            loaded,
            max_model_len=max_len,
            max_running_requests=config.max_sequences,
        )
    if spec.method == "eagle":
        from engine.speculative.eagle import EagleProposer

        say(f"loading draft head {spec.draft_head} ...")
        eagle = EagleProposer.from_engine(spec, loaded, max_len, config.max_sequences)
        if not spec.eagle_prompt_lookup and not spec.eagle_suffix:
            return eagle
        from engine.speculative.combined import LookupThenEagle
        from engine.speculative.ngram import NgramProposer

        lookup = NgramProposer(spec.ngram_min, spec.ngram_max) if spec.eagle_prompt_lookup else None
        return LookupThenEagle(eagle, lookup, build_suffix_proposer(spec) if spec.eagle_suffix else None)
    raise ValueError(f"unknown speculation method {spec.method!r}")


def build_suffix_proposer(spec: SpeculationConfig) -> SuffixProposer:
    from engine.speculative.suffix import SuffixProposer
    from engine.speculative.suffix_index import SuffixMatchParams

    params = SuffixMatchParams(spec.suffix_max_depth, spec.suffix_max_spec_factor, spec.suffix_min_token_prob)
    return SuffixProposer(
        params,
        max_sequences=spec.suffix_max_outputs,
        max_tokens=spec.suffix_max_output_tokens,
        max_draft_tokens=spec.max_draft_tokens,
    )


def load_configured_adapters(manager: LoRAManager, config: LoRAConfig, say: Progress) -> None:
    """Register every configured adapter; load as many as there are slots, the rest on their first request."""
    for name, path in config.adapters.items():
        manager.register(name, path)
        if len(manager.slots) < manager.config.max_loaded:
            manager.install(manager.read(name, path))
            say(f"LoRA adapter {name} loaded from {path}")
