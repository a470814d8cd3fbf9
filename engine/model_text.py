"""A model's tokenizer and context, read from its files without importing torch: for front ends (the edge).

transformers' AutoTokenizer and AutoConfig import its configuration machinery, which imports torch and, for a
Llama config, torch.distributed.tensor and sympy: an edge's tokenizer took ~5 s on 2 cores and left the edge at
~710 MiB resident (54e26a1:docs/benchmarks.md); without them, ~1.5 s and ~160 MiB. Most
tokenizers that transformers 5 writes (every GGUF we convert among them) name their class,
``TokenizersBackend``, in tokenizer_config.json; for the architectures whose AutoTokenizer resolution is that class
(tested against AutoTokenizer for each), that class loads directly, with the same result. Anything else goes
through AutoTokenizer as before. The worker loads its tokenizer the same way (engine.loader), so the edge counts
tokens exactly as the worker does.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.model_ref import check_model_ref, converted_dir, gguf_for, is_model_dir

Progress = Callable[[str], None]


def noop(_: str) -> None:
    pass


# SmolLM2's own ChatML template. The SmolLM2 GGUF carries its template in
# `tokenizer.chat_template`, so this is only a fallback for GGUF files that lack one.
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

def fallback_chat_template(name: str) -> str | None:
    """The template for a GGUF that carries none: SmolLM2's ChatML for a SmolLM2 file (the one model it is
    right for), else None: a model without a template is not given another model's."""
    return CHATML_TEMPLATE if "smollm2" in name.lower() else None


# Architectures whose AutoTokenizer resolution of a tokenizer_config.json naming TokenizersBackend is that class
# itself (transformers 5's rules; tests/unit/engine/test_model_text.py checks each against AutoTokenizer). qwen2
# and qwen3 are not among them: AutoTokenizer replaces the class their folders name with Qwen2Tokenizer.
_BACKEND_ARCHITECTURES = ("llama", "mistral")


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def loads_as_backend(folder: Path) -> bool:
    """Whether AutoTokenizer would load this folder's tokenizer as TokenizersBackend (so it may be loaded directly)."""
    declared = _json(folder / "tokenizer_config.json")
    model_type = _json(folder / "config.json").get("model_type")
    return (declared.get("tokenizer_class") == "TokenizersBackend" and "auto_map" not in declared
            and (folder / "tokenizer.json").is_file() and model_type in _BACKEND_ARCHITECTURES)


def tokenizer_from_folder(folder: Path) -> Any:
    if loads_as_backend(folder):
        from transformers.tokenization_utils_tokenizers import TokenizersBackend

        return TokenizersBackend.from_pretrained(folder)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def _files(name_or_path: str) -> tuple[Path | None, Path | None]:
    """(model folder, None), or (None, GGUF file) for a GGUF not converted yet. Once per call: a GGUF's
    converted_dir reads 8 MB of it for its fingerprint."""
    gguf = gguf_for(name_or_path)
    if gguf is None:
        check_model_ref(name_or_path)
        return Path(name_or_path).expanduser().resolve(), None
    folder = converted_dir(*gguf)
    return (folder, None) if is_model_dir(folder) else (None, gguf[0])


def load_tokenizer(name_or_path: str, progress: Progress = noop) -> Any:
    """The tokenizer alone. For a GGUF not converted yet it is read from the GGUF
    directly (seconds) rather than converting the whole model."""
    folder, gguf = _files(name_or_path)
    if folder is not None:
        return tokenizer_from_folder(folder)
    assert gguf is not None
    from transformers import AutoTokenizer

    progress("loading tokenizer from GGUF ...")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if not tokenizer.chat_template:
        tokenizer.chat_template = fallback_chat_template(gguf.stem)  # see engine.loader.convert_gguf
    return tokenizer


def _plain_context(config: dict[str, Any]) -> int | None:
    """max_position_embeddings, for a Llama config that states it and scales no RoPE (longrope and dynamic scaling
    cap the context: engine.decoder_config._exact_context); the rest go through AutoConfig: None."""
    context = config.get("max_position_embeddings")
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    scaled = rope.get("rope_type", rope.get("type")) in ("longrope", "dynamic")
    if config.get("model_type") != "llama" or scaled or not isinstance(context, int):
        return None
    return context


def model_context(name_or_path: str) -> int:
    """The longest sequence the model handles exactly (as engine.loader.LoadedModel.max_context), from its config
    alone: neither loads weights nor converts a GGUF, so a front end (the edge) can check prompt lengths."""
    folder, gguf = _files(name_or_path)
    context = _plain_context(_json(folder / "config.json")) if folder is not None else None
    if context is not None:
        return context
    from transformers import AutoConfig

    from engine.model import DecoderConfig  # torch: AutoConfig has imported it already

    if folder is not None:
        hf_config = AutoConfig.from_pretrained(folder)
    else:
        assert gguf is not None
        hf_config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    return DecoderConfig.from_hf(hf_config).max_position_embeddings
