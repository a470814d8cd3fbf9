"""The capacity plan for the real default model equals what its engine allocates, batch lines included."""
from __future__ import annotations

import pytest

from streams.ops.capacity import GIB, Workload, cpu_device, plan


@pytest.mark.model
def test_the_plan_for_the_default_model_equals_what_the_engine_allocates() -> None:
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine
    from streams.commands.plan import load_shape

    # fp32, as planned (parameters are the weights; the int4 plan's bytes are an estimate of its packed copies)
    settings = EngineConfig(max_model_len=512, kv_cache_bytes=96 * 1024 * 1024, max_running_requests=8, weights="fp32")
    engine = LLMEngine.from_config(settings)
    usage = engine.kv_cache.usage()
    result = plan(load_shape("smollm2-135m-instruct"), cpu_device(24 * GIB), dtype="float32", max_model_len=512,
                  kv_cache_bytes=96 * 1024 * 1024, max_running_requests=8,
                  draft_tokens=settings.speculation.max_draft_tokens, workload=Workload(256, 128))
    assert result.kv_tokens == usage.total_tokens
    assert result.kv_bytes_per_token == engine.kv_cache.bytes_per_token
    weights = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    assert result.weights_bytes == weights


@pytest.mark.model
def test_the_plan_for_the_default_model_plans_the_format_the_worker_serves_it_in() -> None:
    from engine.config import EngineConfig
    from streams.commands.plan import _served_dtype

    assert EngineConfig().weights == "auto"
    assert _served_dtype("smollm2-135m-instruct", "cpu", "auto", "specstream") == "int4"  # its Q4_1 file
    assert _served_dtype("smollm2-135m-instruct", "cpu", "fp32", "specstream") == "float32"
    assert _served_dtype("smollm2-135m-instruct", "H100-80GB", "auto", "specstream") == "bfloat16"


@pytest.mark.model
def test_the_kv_cap_counts_the_batch_lines_beside_the_running_requests_as_the_engine_does() -> None:
    from engine.config import EngineConfig, batch_line_slots
    from engine.llm_engine import LLMEngine
    from streams.commands.plan import load_shape

    # A budget far above what 2 requests could use: the cap, not the budget, sizes the cache.
    settings = EngineConfig(max_model_len=256, kv_cache_bytes=256 * 1024 * 1024, max_running_requests=2, weights="fp32")
    engine = LLMEngine.from_config(settings)
    result = plan(load_shape("smollm2-135m-instruct"), cpu_device(24 * GIB), dtype="float32", max_model_len=256,
                  kv_cache_bytes=256 * 1024 * 1024, max_running_requests=2,
                  draft_tokens=settings.speculation.max_draft_tokens, workload=Workload(128, 64),
                  batch_lines=batch_line_slots(2, settings.batch_max_share))
    assert result.kv_tokens == engine.kv_cache.usage().total_tokens
