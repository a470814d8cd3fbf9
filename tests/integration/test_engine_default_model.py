"""The real default model through the engine's loader: greedy output equals transformers' generate, and loading it for
serving imports none of torch.compile's machinery."""
from __future__ import annotations

import json

import pytest
import torch

from engine.config import SpeculationConfig, embedded_engine_config
from engine.llm_engine import LLMEngine
from engine.loader import resolve_model_dir
from engine.request import EngineRequest, SamplingOptions
from tests.import_checks import loaded_after


@pytest.mark.model
def test_loading_the_default_model_for_serving_imports_no_torch_compile_machinery() -> None:
    """torch._dynamo drags inductor and triton in: 5-8 s of every worker's start on 2 cores, for nothing served."""
    assert loaded_after(
        "from engine.loader import load_model\n"
        "import engine.grammar.matchers, engine.llm_engine, engine.speculative.eagle_artifact\n"
        "load_model('smollm2-135m-instruct')"
    ) == []


@pytest.mark.model
def test_default_model_greedy_equals_hf_generate() -> None:
    from transformers import AutoModelForCausalLM

    lines: list[str] = []
    engine = LLMEngine.from_config(
        # fp32: transformers' weights (the default, int4, is the file's own codes on int8 activations)
        embedded_engine_config(kv_cache_bytes=1 << 28, weights="fp32", speculation=SpeculationConfig(enabled=False)),
        progress=lines.append
    )
    folder = resolve_model_dir("smollm2-135m-instruct")
    assert (folder / "model.safetensors").is_file()
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    assert engine.tokenizer.chat_template and "<|im_start|>" in engine.tokenizer.chat_template
    assert engine.max_model_len == 2048 and engine.model_name == "smollm2-135m-instruct"

    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = list(engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"])
    out = engine.generate([EngineRequest("fr", prompt, SamplingOptions(max_tokens=16, ignore_eos=True))])["fr"]
    assert "Paris" in out.text

    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.inference_mode():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False, eos_token_id=None,
                          pad_token_id=0, attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    assert out.token_ids == ref[0, len(prompt):].tolist()
