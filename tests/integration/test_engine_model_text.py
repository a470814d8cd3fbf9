"""A model's tokenizer and context read without torch (engine/model_text.py): the same tokenizer AutoTokenizer
gives and the same context AutoConfig gives, for every architecture the engine serves; torch stays out."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from transformers import AutoConfig, AutoTokenizer

from engine.model import SUPPORTED_ARCHITECTURES, DecoderConfig
from engine.model_ref import converted_dir, gguf_for
from engine.model_text import load_tokenizer, loads_as_backend, model_context, tokenizer_from_folder
from tests.import_checks import loaded_after

pytestmark = pytest.mark.model

MODEL = "smollm2-135m-instruct"
TEXTS = ["Hello, world!", "  two  spaces and\ttabs\n", "Ünïcödé — 中文 text 🚀", "def f(x):\n    return x * 2", ""]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is Kafka?"}]


def _default_folder() -> Path:
    gguf = gguf_for(MODEL)
    assert gguf is not None
    folder = converted_dir(*gguf)
    if not folder.is_dir():
        from engine.loader import resolve_model_dir

        folder = resolve_model_dir(MODEL)
    return folder


def _same_tokenizer(ours: object, theirs: object) -> None:
    assert type(ours) is type(theirs)
    for text in TEXTS:
        assert ours(text)["input_ids"] == theirs(text)["input_ids"], text  # type: ignore[operator]
    assert (ours.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)  # type: ignore[attr-defined]
            == theirs.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False))  # type: ignore[attr-defined]
    assert ours.eos_token_id == theirs.eos_token_id and len(ours) == len(theirs)  # type: ignore[attr-defined,arg-type]


@pytest.fixture(scope="module")
def default_folder() -> Path:
    return _default_folder()


@pytest.mark.parametrize("architecture", SUPPORTED_ARCHITECTURES)
def test_the_tokenizer_is_the_one_autotokenizer_gives_for_every_served_architecture(
        architecture: str, default_folder: Path, tmp_path: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        if (default_folder / name).is_file():
            shutil.copy(default_folder / name, tmp_path / name)
    AutoConfig.for_model(architecture).save_pretrained(tmp_path)
    _same_tokenizer(tokenizer_from_folder(tmp_path), AutoTokenizer.from_pretrained(tmp_path))


def test_a_folder_whose_tokenizer_names_another_class_goes_through_autotokenizer(
        default_folder: Path, tmp_path: Path) -> None:
    shutil.copytree(default_folder, tmp_path / "m", ignore=shutil.ignore_patterns("*.safetensors"))
    folder = tmp_path / "m"
    assert loads_as_backend(folder)
    declared = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**declared, "tokenizer_class": "PreTrainedTokenizerFast"}))
    assert not loads_as_backend(folder)
    _same_tokenizer(tokenizer_from_folder(folder), AutoTokenizer.from_pretrained(folder))


def test_the_default_models_tokenizer_and_context_equal_transformers_and_import_no_torch(default_folder: Path) -> None:
    _same_tokenizer(load_tokenizer(MODEL), AutoTokenizer.from_pretrained(default_folder))
    assert model_context(MODEL) == DecoderConfig.from_hf(AutoConfig.from_pretrained(default_folder)).max_position_embeddings
    code = f"from engine.model_text import load_tokenizer, model_context\nload_tokenizer({MODEL!r})\nmodel_context({MODEL!r})"
    assert loaded_after(code, ("torch", "sympy")) == []


@pytest.mark.parametrize(("config", "context", "windows"), [
    ({"model_type": "llama", "max_position_embeddings": 4096}, 4096, ()),
    # Dynamic RoPE scaling changes HF's frequencies past the original context: that is what is served.
    ({"model_type": "llama", "max_position_embeddings": 16384,
      "rope_scaling": {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 4096}}, 4096, ()),
    # Windows are applied, so they do not cap the context: every layer of a mistral.
    ({"model_type": "mistral", "max_position_embeddings": 32768, "sliding_window": 4096, "num_hidden_layers": 2},
     32768, (4096, 4096)),
    ({"model_type": "mistral", "max_position_embeddings": 32768, "sliding_window": None}, 32768, ()),
    # No max_position_embeddings: LlamaConfig's default (2048).
    ({"model_type": "llama"}, 2048, ()),
    ({"model_type": "qwen3", "max_position_embeddings": 40960, "num_hidden_layers": 2, "layer_types": ["full_attention"] * 2,
      "sliding_window": 4096}, 40960, ()),
    # Qwen2Config drops the window unless use_sliding_window, and makes layer types of it when it is set.
    ({"model_type": "qwen2", "max_position_embeddings": 32768, "sliding_window": 1024, "num_hidden_layers": 2,
      "layer_types": ["sliding_attention", "full_attention"]}, 32768, ()),
    ({"model_type": "qwen2", "max_position_embeddings": 32768, "sliding_window": 1024, "num_hidden_layers": 2,
      "use_sliding_window": True, "max_window_layers": 1}, 32768, (None, 1024)),
])
def test_the_context_and_windows_are_what_the_engine_reads_from_the_config(
        config: dict, context: int, windows: tuple, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert model_context(str(tmp_path)) == context
    engine_cfg = DecoderConfig.from_hf(AutoConfig.from_pretrained(tmp_path))
    assert (engine_cfg.max_position_embeddings, engine_cfg.layer_windows) == (context, windows)
