"""`specstream plan`: memory arithmetic that matches the engine and published figures, and clear refusals."""
from __future__ import annotations

import pytest

from streams.ops.capacity import DEVICES, GIB, PRESETS, ModelShape, PlanError, Workload, cpu_device, plan


def preset(name: str) -> ModelShape:
    return ModelShape.from_hf_config(name, PRESETS[name])


@pytest.mark.parametrize(("name", "published_params"), [
    ("llama-2-7b", 6_738_415_616),  # Meta's model card: 6.74 B
    ("llama-3-8b", 8_030_261_248),  # 8.03 B
])
def test_parameter_counts_equal_the_published_ones(name: str, published_params: int) -> None:
    assert preset(name).num_params == published_params


def test_kv_bytes_per_token_match_published_figures() -> None:
    # Llama-2-7B (no GQA): 0.5 MiB per token in fp16; Llama-3-8B (8 KV heads): 128 KiB.
    assert preset("llama-2-7b").kv_bytes_per_token(2) == 512 * 1024
    assert preset("llama-3-8b").kv_bytes_per_token(2) == 128 * 1024
    # The vLLM paper's example: OPT-13B needs 800 KB of KV cache per token (40 layers, 40 heads of 128, fp16).
    opt_13b = ModelShape("opt-13b", 40, 5120, 40, 40, 128, 20480, 50272, True, 2048)
    assert opt_13b.kv_bytes_per_token(2) == 800 * 1024


def test_an_8b_model_on_an_h100_leaves_room_for_hundreds_of_sequences() -> None:
    result = plan(preset("llama-3-8b"), DEVICES["H100-80GB"], dtype="bfloat16", max_model_len=8192,
                  workload=Workload(prompt_tokens=1024, output_tokens=512))
    assert 14.9 < result.weights_bytes / GIB < 15.0
    # (80 GB - 3 GiB overhead - 15 GiB weights) x 0.9 / 128 KiB ≈ 420k tokens.
    assert 380_000 < result.kv_tokens < 460_000
    assert result.max_sequences == result.kv_tokens // (1536 + 9)
    assert result.estimates[0].bound == "memory" and result.estimates[0].tokens_per_s > 100


def test_the_fleet_is_sized_for_the_target_rate_and_partitions_allow_growth() -> None:
    result = plan(preset("llama-3-8b"), DEVICES["A10G-24GB"], workload=Workload(512, 256, requests_per_s=50))
    assert result.replicas is not None and result.replicas >= 2
    assert result.partitions >= 2 * result.replicas
    assert result.settings()["kafka.request_partitions"] == result.partitions


def test_a_model_that_does_not_fit_is_refused_with_the_sizes() -> None:
    with pytest.raises(PlanError, match=r"does not fit on T4-16GB: its bfloat16 weights take 15\.0 GiB"):
        plan(preset("llama-3-8b"), DEVICES["T4-16GB"])


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"dtype": "float8"}, "dtype 'float8'"),
    ({"kv_cache_fraction": 0.0}, "kv_cache_fraction"),
    ({"max_model_len": 256}, "longer than max_model_len"),
    ({"kv_cache_bytes": 1024}, "holds 0 tokens"),
])
def test_nonsense_inputs_get_a_message_naming_them(kwargs: dict, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        plan(preset("llama-2-7b"), DEVICES["A100-80GB"], **kwargs)


def test_a_device_without_memory_is_refused() -> None:
    with pytest.raises(PlanError, match="has no memory"):
        plan(preset("llama-2-7b"), cpu_device(0))


@pytest.mark.parametrize(("backend", "device", "dtype"), [
    ("specstream", "H100-80GB", "int4"),  # our quantized kernels are CPU kernels
    ("vllm", "cpu", "int8"),
    ("vllm", "H100-80GB", "int4"),
])
def test_a_format_the_chosen_backend_cannot_run_on_the_device_is_not_offered(backend: str, device: str,
                                                                           dtype: str) -> None:
    target = DEVICES[device] if device != "cpu" else cpu_device(24 * GIB)
    with pytest.raises(PlanError, match=f"engine.backend {backend} does not run {dtype}"):
        plan(preset("llama-3-8b"), target, dtype=dtype, backend=backend)


def test_the_settings_name_the_backend_and_put_quantized_formats_under_engine_weights() -> None:
    quantized = plan(preset("llama-3-8b"), cpu_device(24 * GIB), dtype="int4").settings()
    assert quantized["engine.weights"] == "int4" and "engine.dtype" not in quantized
    assert quantized["engine.backend"] == "specstream"
    gpu = plan(preset("llama-3-8b"), DEVICES["H100-80GB"], dtype="bfloat16", backend="vllm").settings()
    assert gpu["engine.dtype"] == "bfloat16" and gpu["engine.backend"] == "vllm"
