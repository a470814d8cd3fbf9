"""Logprobs are the target's raw log_softmax at each emitted position, from a draft or not (vLLM's raw_logprobs)."""
from __future__ import annotations

import pytest
import torch
from _engine_factories import TruthProposer, make_engine, random_prompts, tiny_hf_model

from engine.config import SpeculationConfig
from engine.request import EngineRequest, SamplingOptions
from engine.speculative.controller import SpeculationController

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def llama():
    return tiny_hf_model("llama")


@torch.inference_mode()
def _hf_logprobs(hf, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """[len(tokens), V]: transformers' log_softmax at each generated position."""
    ids = torch.tensor([prompt + tokens])
    logits = hf(ids).logits[0, len(prompt) - 1 : -1]
    return logits.float().log_softmax(dim=-1)


@pytest.mark.parametrize("temperature", [0.0, 0.8], ids=["greedy", "seeded"])
def test_logprobs_with_speculation_equal_plain_and_transformers_log_softmax(llama, temperature: float) -> None:
    prompts = [[5, 6, 7, 8] * 4, random_prompts([9], seed=4)[0]]
    # Processors change the sampled tokens, never the reported (raw) logprobs.
    params = SamplingOptions(max_tokens=16, temperature=temperature, seed=5, logprobs=3, repetition_penalty=1.3)
    requests = lambda: [EngineRequest(f"r{i}", p, params) for i, p in enumerate(prompts)]
    plain = make_engine(llama).generate(requests())
    truth = {rid: r.token_ids for rid, r in plain.items()}
    proposer = TruthProposer(truth, {f"r{i}": len(p) for i, p in enumerate(prompts)})
    spec = SpeculationConfig(enabled=True, max_draft_tokens=4)
    controller = SpeculationController(SpeculationConfig(max_draft_tokens=4, adaptive=False))
    fast = make_engine(llama, speculation=spec, proposer=proposer, controller=controller).generate(requests())
    assert sum(r.spec.accepted for r in fast.values()) > 0
    for i, prompt in enumerate(prompts):
        got, ref = fast[f"r{i}"], plain[f"r{i}"]
        assert got.token_ids == ref.token_ids and got.logprobs is not None and ref.logprobs is not None
        assert [e.token_id for e in got.logprobs] == got.token_ids
        want = _hf_logprobs(llama, prompt, got.token_ids)
        for j, entry in enumerate(got.logprobs):
            assert abs(entry.logprob - want[j, entry.token_id].item()) < 1e-4
            top = want[j].topk(3)
            assert [t for t, _ in entry.top] == top.indices.tolist()
            assert max(abs(lp - w) for (_, lp), w in zip(entry.top, top.values.tolist())) < 1e-4
            assert abs(entry.logprob - ref.logprobs[j].logprob) < 1e-4


def test_no_logprobs_unless_asked_and_zero_top_gives_only_the_token(llama) -> None:
    engine = make_engine(llama)
    res = engine.generate([EngineRequest("a", [1, 2, 3], SamplingOptions(max_tokens=4)),
                           EngineRequest("b", [1, 2, 3], SamplingOptions(max_tokens=4, logprobs=0))])
    assert res["a"].logprobs is None
    assert res["b"].logprobs is not None and len(res["b"].logprobs) == 4
    assert all(e.top == () for e in res["b"].logprobs)
