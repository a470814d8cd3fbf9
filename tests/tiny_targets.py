"""Tiny random targets saved as model folders, for tests of commands that load a model by path."""
from __future__ import annotations

from pathlib import Path

import torch


def tiny_chat_target(folder: Path, seed: int = 0, initializer_range: float = 0.02) -> Path:
    """A random 2-layer Llama speaking SmolLM2's tokenizer (so chat prompts render as the worker renders them).
    A larger initializer_range gives sharper logits, whose greedy tokens bf16 rounding changes somewhere."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from engine.model_text import load_tokenizer

    tokenizer = load_tokenizer("smollm2-135m-instruct")
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                      tie_word_embeddings=True, initializer_range=initializer_range)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
