"""Sampling controls (penalties, min_p, logit_bias, stop_token_ids, min_tokens): equal to transformers' logits
processors, and lossless under speculation (the same tokens as plain decoding, greedy and seeded)."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from _engine_factories import (
    VOCAB,
    TruthProposer,
    make_engine,
    random_prompts,
    tiny_hf_model,
)

from engine.config import SpeculationConfig
from engine.logits_processors import SequenceRows, process_
from engine.request import EngineRequest, SamplingOptions
from engine.sampler import target_probs
from engine.speculative.controller import SpeculationController

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def llama():
    return tiny_hf_model("llama")


CONTROLS = {
    "presence_penalty": {"presence_penalty": 1.5},
    "frequency_penalty": {"frequency_penalty": 0.8},
    "repetition_penalty": {"repetition_penalty": 1.4},
    "min_p": {"min_p": 0.2},
    "logit_bias": {"logit_bias": ((7, 5.0), (11, -100.0), (13, 3.0))},
    "stop_token_ids": {"stop_token_ids": (7, 42)},
    "min_tokens": {"min_tokens": 6, "stop_token_ids": (7, 42)},
    "all_together": {"presence_penalty": 0.5, "frequency_penalty": 0.3, "repetition_penalty": 1.2, "min_p": 0.05,
                     "logit_bias": ((9, 2.0),), "min_tokens": 3},
}


def _requests(prompts: list[list[int]], params: SamplingOptions) -> list[EngineRequest]:
    return [EngineRequest(f"r{i}", p, replace(params, seed=None if params.seed is None else params.seed + i))
            for i, p in enumerate(prompts)]


@pytest.mark.parametrize("temperature", [0.0, 0.9], ids=["greedy", "seeded"])
@pytest.mark.parametrize("control", list(CONTROLS))
def test_each_control_under_speculation_equals_plain_decoding(llama, control: str, temperature: float) -> None:
    prompts = [[5, 6, 7, 8] * 4, random_prompts([9], seed=4)[0]]
    params = SamplingOptions(max_tokens=24, temperature=temperature, seed=11, ignore_eos=False, **CONTROLS[control])
    plain = make_engine(llama, eos=frozenset({3})).generate(_requests(prompts, params))
    truth = {rid: r.token_ids for rid, r in plain.items()}
    proposer = TruthProposer(truth, {f"r{i}": len(p) for i, p in enumerate(prompts)})
    spec = SpeculationConfig(enabled=True, max_draft_tokens=4)
    controller = SpeculationController(SpeculationConfig(max_draft_tokens=4, adaptive=False))
    fast = make_engine(llama, eos=frozenset({3}), speculation=spec, proposer=proposer, controller=controller)
    res = fast.generate(_requests(prompts, params))
    for rid, r in res.items():
        assert r.token_ids == truth[rid], rid
        assert r.finish_reason == plain[rid].finish_reason
    assert sum(r.spec.accepted for r in res.values()) > 0


def test_controls_change_the_output(llama) -> None:
    """Guards the test above against a processor that does nothing."""
    prompts = [[5, 6, 7, 8] * 4]
    base = make_engine(llama).generate(_requests(prompts, SamplingOptions(max_tokens=80, ignore_eos=True)))
    strong = {"presence_penalty": 50.0, "frequency_penalty": 50.0, "repetition_penalty": 50.0}
    for control in ("presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias"):
        options = CONTROLS[control] if control == "logit_bias" else {control: strong[control]}
        params = SamplingOptions(max_tokens=80, ignore_eos=True, **options)
        got = make_engine(llama).generate(_requests(prompts, params))
        assert got["r0"].token_ids != base["r0"].token_ids, control


def _rows(params: SamplingOptions, prompt: list[int], output: list[int]) -> SequenceRows:
    return SequenceRows(params, prompt, output, [], 0)


def test_repetition_penalty_equals_transformers_processor() -> None:
    from transformers import RepetitionPenaltyLogitsProcessor

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, VOCAB, generator=g) * 3
    prompt, output = [1, 5, 5, 9], [17, 1, 200]
    ours = logits.clone()
    process_(ours, [_rows(SamplingOptions(repetition_penalty=1.3), prompt, output)], frozenset())
    theirs = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([prompt + output]), logits.clone())
    torch.testing.assert_close(ours, theirs)


def test_min_p_equals_transformers_warper() -> None:
    from transformers import MinPLogitsWarper, TemperatureLogitsWarper

    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, VOCAB, generator=g) * 3
    params = SamplingOptions(temperature=0.7, min_p=0.1)
    ids = torch.zeros(2, 1, dtype=torch.long)
    warped = MinPLogitsWarper(0.1)(ids, TemperatureLogitsWarper(0.7)(ids, logits.clone()))
    torch.testing.assert_close(target_probs(logits, params), warped.softmax(dim=-1))


def test_logit_bias_equals_transformers_sequence_bias() -> None:
    from transformers import SequenceBiasLogitsProcessor

    g = torch.Generator().manual_seed(2)
    logits = torch.randn(1, VOCAB, generator=g)
    bias = ((7, 5.0), (11, -100.0), (250, 0.5))
    ours = logits.clone()
    process_(ours, [_rows(SamplingOptions(logit_bias=bias), [1, 2], [])], frozenset())
    theirs = SequenceBiasLogitsProcessor({(t,): b for t, b in bias})(torch.tensor([[1, 2]]), logits.clone())
    torch.testing.assert_close(ours, theirs)


def test_min_tokens_equals_transformers_min_new_tokens_processor() -> None:
    from transformers import MinNewTokensLengthLogitsProcessor

    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(3))
    prompt = [4, 5, 6]
    for generated in ([], [8, 9], [8, 9, 10, 11]):
        ours = logits.clone()
        process_(ours, [_rows(SamplingOptions(min_tokens=3), prompt, generated)], frozenset({3}))
        hf = MinNewTokensLengthLogitsProcessor(len(prompt), 3, eos_token_id=3)
        theirs = hf(torch.tensor([prompt + generated]), logits.clone())
        torch.testing.assert_close(ours, theirs)


def test_greedy_repetition_penalty_and_min_tokens_equal_hf_generate(llama) -> None:
    prompt = [5, 6, 7, 8] * 4
    engine = make_engine(llama, eos=frozenset({3}))
    params = SamplingOptions(max_tokens=20, repetition_penalty=1.3, min_tokens=20)
    got = engine.generate([EngineRequest("r", prompt, params)])["r"].token_ids
    with torch.inference_mode():
        want = llama.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False, repetition_penalty=1.3,
                              min_new_tokens=20, eos_token_id=3, pad_token_id=0,
                              attention_mask=torch.ones(1, len(prompt), dtype=torch.long))[0, len(prompt):].tolist()
    assert got == want


def test_penalties_count_only_generated_tokens_and_drafts_accepted_before_the_row() -> None:
    logits = torch.zeros(3, 10)
    rows = SequenceRows(SamplingOptions(frequency_penalty=1.0, presence_penalty=0.5), [4, 4], [2, 2], [2, 5], 0)
    process_(logits, [rows], frozenset())
    assert logits[0, 2].item() == -2.5 and logits[0, 4].item() == 0.0  # the prompt's 4 is not penalised
    assert logits[1, 2].item() == -3.5 and logits[1, 5].item() == 0.0
    assert logits[2, 5].item() == -1.5


def test_a_stop_token_id_ends_generation_with_stop(llama) -> None:
    engine = make_engine(llama)
    plain = engine.generate([EngineRequest("a", [5, 6, 7], SamplingOptions(max_tokens=12))])["a"].token_ids
    stop = plain[4]
    first = plain.index(stop)
    res = make_engine(llama).generate([EngineRequest("b", [5, 6, 7], SamplingOptions(max_tokens=12,
                                                                                      stop_token_ids=(stop,)))])["b"]
    assert res.finish_reason == "stop" and res.token_ids == plain[: first + 1]


def test_token_ids_outside_the_vocabulary_are_rejected_naming_the_field(llama) -> None:
    from engine.request import RequestRejected

    engine = make_engine(llama)
    for params, field in ((SamplingOptions(logit_bias=((VOCAB, 1.0),)), "logit_bias"),
                          (SamplingOptions(stop_token_ids=(VOCAB + 3,)), "stop_token_ids")):
        with pytest.raises(RequestRejected) as caught:
            engine.add_request(EngineRequest("x", [1, 2], params))
        assert caught.value.code == "invalid_request" and caught.value.message.startswith(field)
