"""engine.weights is planned before the load: what the format replaces is never read from the checkpoint, and the
start holds one copy of the weights it keeps."""
from __future__ import annotations

from pathlib import Path

import pytest

from engine.config import SpeculationConfig, embedded_engine_config
from engine.fused.build import load_ops
from engine.llm_engine import LLMEngine
from engine.loader import load_model
from engine.request import EngineRequest, SamplingOptions
from engine.weight_plan import WeightRequest, apply_weights
from tests.tiny_targets import tiny_chat_target


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_chat_target(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def target(tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    load_ops("decoder_step")  # built (or found) in the usual cache, once per process, before the cache moves
    monkeypatch.setenv("SPECSTREAM_CACHE_DIR", str(tmp_path / "cache"))  # the quantized cache starts empty
    return tiny


def _greedy(target: Path, fmt: str = "int4") -> list[int]:
    engine = LLMEngine.from_config(embedded_engine_config(
        model=str(target), weights=fmt, kv_cache_bytes=1 << 22, kernel_dispatch="fixed",
        speculation=SpeculationConfig(enabled=False)))
    request = EngineRequest("r", list(range(100, 120)), SamplingOptions(max_tokens=12, ignore_eos=True))
    return engine.generate([request])["r"].token_ids


def test_once_the_quantized_weights_are_cached_a_start_never_reads_the_float_linears_and_serves_the_same_tokens(
        target: Path) -> None:
    first = _greedy(target)  # no cache yet: quantized from the floats, and cached
    loaded = load_model(str(target), device="cpu", weights=WeightRequest("int4"))
    assert loaded.weights is not None and loaded.weights.origin == "cache"
    layer = loaded.model.layers[0]
    assert layer.self_attn.qkv_proj.weight.is_meta and layer.mlp.down_proj.weight.is_meta
    assert loaded.model.embed_tokens.weight.is_meta  # the tied head too
    assert not loaded.model.norm.weight.is_meta and not layer.input_layernorm.weight.is_meta
    assert _greedy(target) == first


def test_an_eagle_target_keeps_its_float_embedding_for_the_head_to_bind(target: Path) -> None:
    _greedy(target)
    loaded = load_model(str(target), device="cpu", weights=WeightRequest("int4", float_embedding=True))
    assert loaded.model.layers[0].self_attn.qkv_proj.weight.is_meta
    assert not loaded.model.embed_tokens.weight.is_meta


def test_without_a_cache_or_gguf_blocks_the_floats_are_read_and_fp32_reads_everything(target: Path) -> None:
    for fmt in ("int4", "fp32"):
        loaded = load_model(str(target), device="cpu", weights=WeightRequest(fmt))
        assert not any(t.is_meta for t in loaded.model.parameters())


def test_a_model_loaded_for_one_format_is_refused_another_naming_what_was_never_read(target: Path) -> None:
    _greedy(target)
    loaded = load_model(str(target), device="cpu", weights=WeightRequest("int4"))
    with pytest.raises(RuntimeError, match=r"does not replace embed_tokens\.weight, which was loaded for int4"):
        apply_weights(loaded, "fp32", wide=False)


def test_a_cache_removed_between_the_plan_and_the_install_is_an_error_not_garbage(target: Path, tmp_path: Path) -> None:
    _greedy(target)
    loaded = load_model(str(target), device="cpu", weights=WeightRequest("int4"))
    for cached in (tmp_path / "cache" / "quantized").iterdir():
        cached.unlink()
    with pytest.raises(RuntimeError, match="went away .* start it again"):
        apply_weights(loaded, "int4", wide=False)
