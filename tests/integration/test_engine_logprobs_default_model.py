"""The real default model at fp32: the engine's logprobs, with speculation on, equal transformers' log_softmax."""
from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig, SpeculationConfig
from engine.llm_engine import LLMEngine
from engine.loader import resolve_model_dir
from engine.request import EngineRequest, SamplingOptions


@pytest.mark.model
def test_logprobs_of_a_speculating_fp32_engine_equal_transformers_log_softmax() -> None:
    from transformers import AutoModelForCausalLM

    engine = LLMEngine.from_config(EngineConfig(
        kv_cache_bytes=1 << 28, dtype="float32", weights="fp32",
        speculation=SpeculationConfig(enabled=True, method="ngram", max_draft_tokens=4, adaptive=False)))
    # A repetitive prompt, so the n-gram proposer drafts and some drafts are accepted.
    prompt = engine.tokenizer("one two three four, one two three four, one two three four, one two")["input_ids"]
    params = SamplingOptions(max_tokens=24, temperature=0.8, seed=3, logprobs=5, ignore_eos=True)
    out = engine.generate([EngineRequest("lp", list(prompt), params)])["lp"]
    assert out.logprobs is not None and out.stats is not None and out.stats.spec.accepted > 0

    hf = AutoModelForCausalLM.from_pretrained(resolve_model_dir("smollm2-135m-instruct"), dtype=torch.float32).eval()
    with torch.inference_mode():
        logits = hf(torch.tensor([list(prompt) + out.token_ids])).logits[0, len(prompt) - 1 : -1]
    want = logits.float().log_softmax(dim=-1)
    for j, entry in enumerate(out.logprobs):
        assert abs(entry.logprob - want[j, entry.token_id].item()) < 1e-4, j
        top = want[j].topk(5)
        assert max(abs(lp - w) for (_, lp), w in zip(entry.top, top.values.tolist())) < 1e-4, j
