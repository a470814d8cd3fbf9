"""Reading PEFT adapter folders: what fits the base model loads, what we do not serve is refused naming why."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from _engine_factories import tiny_hf_model
from safetensors.torch import load_file, save_file

from engine.lora.adapter import AdapterError, read_adapter
from engine.model import DecoderConfig
from tests.lora_support import edit_config, save_random_adapter


@pytest.fixture(scope="module")
def hf() -> Any:
    return tiny_hf_model("llama")


@pytest.fixture(scope="module")
def cfg(hf: Any) -> DecoderConfig:
    return DecoderConfig.from_hf(hf.config)


def test_weights_are_transposed_and_scaled_as_peft_scales_them(hf: Any, cfg: DecoderConfig, tmp_path: Path) -> None:
    for rslora, scaling in ((False, 12 / 4), (True, 12 / math.sqrt(4))):
        folder = save_random_adapter(hf, tmp_path / str(rslora), r=4, alpha=12, targets=["q_proj", "down_proj"],
                                     rslora=rslora)
        raw = load_file(str(folder / "adapter_model.safetensors"))
        adapter = read_adapter("a", folder, cfg, max_rank=8)
        key = "base_model.model.model.layers.1.mlp.down_proj.lora_"
        a_t, b_t = adapter.weights[(1, "down_proj")]
        assert torch.equal(a_t, raw[key + "A.weight"].t())
        torch.testing.assert_close(b_t, raw[key + "B.weight"].t() * scaling)
        assert adapter.rank == 4 and {p for _, p in adapter.weights} == {"q_proj", "down_proj"}


@pytest.mark.parametrize(("change", "message"), [
    ({"use_dora": True}, "DoRA adapters"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
    ({"target_modules": ["q_proj", "embed_tokens"]}, "LoRA on embed_tokens is not supported"),
    ({"bias": "all"}, "trained biases"),
    ({"peft_type": "IA3"}, "peft_type 'IA3'"),
])
def test_unsupported_configs_are_refused_naming_the_feature(
    hf: Any, cfg: DecoderConfig, tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    folder = edit_config(save_random_adapter(hf, tmp_path / "a", targets=["q_proj"]), **change)
    with pytest.raises(AdapterError, match=message):
        read_adapter("a", folder, cfg, max_rank=16)


def test_rank_above_max_rank_is_refused(hf: Any, cfg: DecoderConfig, tmp_path: Path) -> None:
    folder = save_random_adapter(hf, tmp_path / "a", r=8, targets=["v_proj"])
    with pytest.raises(AdapterError, match="rank 8 exceeds max_rank 4"):
        read_adapter("big", folder, cfg, max_rank=4)


def test_an_adapter_of_another_base_model_is_refused_by_shape(cfg: DecoderConfig, tmp_path: Path) -> None:
    other = tiny_hf_model("llama", hidden_size=32, intermediate_size=64)
    folder = save_random_adapter(other, tmp_path / "a", targets=["o_proj"])
    with pytest.raises(AdapterError, match=r"o_proj.lora_A does not fit the base model"):
        read_adapter("other", folder, cfg, max_rank=16)


def test_dora_tensors_and_lm_head_tensors_are_refused_by_name(hf: Any, cfg: DecoderConfig, tmp_path: Path) -> None:
    folder = save_random_adapter(hf, tmp_path / "a", targets=["q_proj"])
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    tensors["base_model.model.lm_head.lora_A.weight"] = torch.zeros(4, 64)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    with pytest.raises(AdapterError, match="unsupported tensor 'base_model.model.lm_head.lora_A.weight'"):
        read_adapter("a", folder, cfg, max_rank=16)


@pytest.mark.parametrize(("setup", "message"), [
    (lambda d: None, "is not a directory"),
    (lambda d: d.mkdir(), "has no adapter_config.json"),
    (lambda d: (d.mkdir(), (d / "adapter_config.json").write_text("{")), "unreadable adapter_config.json"),
    (lambda d: (d.mkdir(), (d / "adapter_config.json").write_text("{}")), "has no adapter_model.safetensors"),
    (lambda d: (d.mkdir(), (d / "adapter_config.json").write_text("{}"),
                (d / "adapter_model.safetensors").write_bytes(b"junk")), "unreadable safetensors file"),
])
def test_missing_or_broken_files_are_refused_naming_the_file(cfg: DecoderConfig, tmp_path: Path, setup: Any,
                                                             message: str) -> None:
    setup(tmp_path / "a")
    with pytest.raises(AdapterError, match=message):
        read_adapter("a", tmp_path / "a", cfg, max_rank=16)
