"""Gemma 2 and Gemma 3 (tiny random configs, windows shorter than the sequences; Gemma 2's soft-caps low enough to
bite) in our decoder and engine equal transformers."""
from __future__ import annotations

from typing import Any

import pytest
import torch
from _engine_factories import (
    TruthProposer,
    every_format_runs,  # noqa: F401  (fixture)
    hf_greedy,
    make_engine,
    needs_bf16_gemm,
    random_prompts,
    single_thread,  # noqa: F401  (fixture)
    tiny_hf_model,
)
from test_model_parity import cache_for, hf_logits, run_chunks

from engine.config import SpeculationConfig
from engine.model import Decoder, DecoderConfig, UnsupportedModelError
from engine.request import EngineRequest, SamplingOptions
from engine.speculative.controller import SpeculationController

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module", params=["gemma2", "gemma3"])
def gemma(request: pytest.FixtureRequest) -> Any:
    return tiny_hf_model(request.param)


def test_the_tiny_config_has_windows_shorter_than_the_tests_sequences(gemma: Any) -> None:
    cfg = DecoderConfig.from_hf(gemma.config)
    assert cfg.layer_windows == (8, None, 8)
    assert cfg.max_position_embeddings == gemma.config.max_position_embeddings  # applied: the context is not capped
    if cfg.model_type == "gemma3_text":  # its local layers' own RoPE base, q/k norms, no attention cap
        assert cfg.local_rope_layers == (True, False, True) and cfg.qk_norm and cfg.attn_softcap is None
    else:
        assert cfg.local_rope_layers == () and not cfg.qk_norm and (cfg.attn_softcap, cfg.final_softcap) == (2.0, 5.0)


def test_logits_match_hf_in_one_flat_batch_of_sequences_longer_than_the_window(gemma: Any) -> None:
    model = Decoder.from_hf(gemma, 256)
    a, b, c = random_prompts([17, 9, 1], seed=5)
    got = run_chunks(model, cache_for(gemma), [(0, a, 0), (100, b, 0), (200, c, 0)])
    ref = torch.cat([hf_logits(gemma, a), hf_logits(gemma, b), hf_logits(gemma, c)])
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=0)


def test_chunks_and_decodes_past_the_window_match_hf(gemma: Any) -> None:
    model, cache = Decoder.from_hf(gemma, 256), cache_for(gemma)
    ids = random_prompts([30], seed=6)[0]
    # Chunks of 11 and 12 after a cached prefix longer than the window, then single decodes.
    rows = [run_chunks(model, cache, [(40, ids[0:11], 0)]), run_chunks(model, cache, [(40, ids[11:23], 11)])]
    rows += [run_chunks(model, cache, [(40, [ids[i]], i)]) for i in range(23, 30)]
    torch.testing.assert_close(torch.cat(rows), hf_logits(gemma, ids), atol=1e-4, rtol=0)


def test_the_window_changes_the_logits_of_rows_past_it(gemma: Any) -> None:
    """Without the window (a model whose window spans everything) rows past 8 differ: the parity above needs it."""
    wide = tiny_hf_model(kind(gemma), sliding_window=256)
    wide.load_state_dict(gemma.state_dict())
    ids = random_prompts([20], seed=7)[0]
    ours = run_chunks(Decoder.from_hf(gemma, 256), cache_for(gemma), [(0, ids, 0)])
    unwindowed = hf_logits(wide, ids)
    torch.testing.assert_close(ours[:8], unwindowed[:8], atol=1e-4, rtol=0)
    assert (ours[8:] - unwindowed[8:]).abs().max() > 1e-2


def kind(hf: Any) -> str:
    return "gemma2" if hf.config.model_type == "gemma2" else "gemma3"


def test_final_logit_softcapping_matches_hf(gemma: Any) -> None:
    hf = tiny_hf_model(kind(gemma), final_logit_softcapping=3.0)
    ids = random_prompts([12], seed=8)[0]
    got = run_chunks(Decoder.from_hf(hf, 256), cache_for(hf), [(0, ids, 0)])
    ref = hf_logits(hf, ids)
    assert ref.abs().max() < 3.0
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=0)


def test_gemma2s_attention_cap_bites_and_the_eager_attention_keeps_hfs_logits() -> None:
    capped, uncapped = tiny_hf_model("gemma2"), tiny_hf_model("gemma2", attn_logit_softcapping=None)
    ids = random_prompts([12], seed=16)[0]
    got = run_chunks(Decoder.from_hf(capped, 256), cache_for(capped), [(0, ids, 0)])
    torch.testing.assert_close(got, hf_logits(capped, ids), atol=1e-4, rtol=0)
    assert (got - hf_logits(uncapped, ids)).abs().max() > 1e-2


def test_bidirectional_attention_is_refused_before_any_weight_is_read() -> None:
    from transformers import Gemma3TextConfig

    with pytest.raises(UnsupportedModelError, match="use_bidirectional_attention"):
        DecoderConfig.from_hf(Gemma3TextConfig(use_bidirectional_attention=True))


PROMPTS = random_prompts([7, 15, 21], seed=9) + [random_prompts([5], seed=10)[0] * 4]  # the last: n-gram matches
MAX_TOKENS = 20


def requests() -> list[EngineRequest]:
    params = SamplingOptions(max_tokens=MAX_TOKENS, ignore_eos=True)
    return [EngineRequest(f"r{i}", p, params) for i, p in enumerate(PROMPTS)]


@pytest.fixture(scope="module")
def hf_reference(gemma: Any) -> dict[str, list[int]]:
    return {f"r{i}": hf_greedy(gemma, p, MAX_TOKENS) for i, p in enumerate(PROMPTS)}


def test_greedy_through_the_engine_equals_hf_generate(gemma: Any, hf_reference: dict[str, list[int]]) -> None:
    # A small token budget chunks the prompts, so chunks attend to cached prefixes past the window.
    res = make_engine(gemma, max_batched_tokens=6).generate(requests())
    assert {rid: r.token_ids for rid, r in res.items()} == hf_reference


def test_ngram_speculation_keeps_hf_greedy(gemma: Any, hf_reference: dict[str, list[int]]) -> None:
    spec = SpeculationConfig(enabled=True, method="ngram", max_draft_tokens=4)
    controller = SpeculationController(spec.model_copy(update={"adaptive": False}))
    res = make_engine(gemma, speculation=spec, controller=controller).generate(requests())
    assert sum(r.spec.drafted for r in res.values()) > 0
    assert {rid: r.token_ids for rid, r in res.items()} == hf_reference


def test_verified_drafts_past_the_window_keep_hf_greedy(gemma: Any, hf_reference: dict[str, list[int]]) -> None:
    """Drafts that are mostly right (TruthProposer): verification rows past the window are accepted and rejected."""
    proposer = TruthProposer(hf_reference, {f"r{i}": len(p) for i, p in enumerate(PROMPTS)})
    spec = SpeculationConfig(enabled=True, max_draft_tokens=4)
    controller = SpeculationController(SpeculationConfig(max_draft_tokens=4, adaptive=False))
    res = make_engine(gemma, speculation=spec, proposer=proposer, controller=controller).generate(requests())
    assert sum(r.spec.accepted for r in res.values()) > 0
    assert {rid: r.token_ids for rid, r in res.items()} == hf_reference


@pytest.mark.usefixtures("every_format_runs")
@pytest.mark.parametrize("fmt", [pytest.param("bf16", marks=needs_bf16_gemm), "int8", "int4"])
def test_every_format_runs_gemma_on_the_fused_step_and_speculation_keeps_its_tokens(gemma: Any, fmt: str) -> None:
    plain = make_engine(gemma, weights=fmt)
    assert plain.weight_format == fmt and plain.model.fused_step is not None  # Gemma 2's soft cap included
    layer_by_layer = make_engine(gemma, weights=fmt, fused_step=False).generate(requests())
    tokens = {rid: r.token_ids for rid, r in layer_by_layer.items()}
    assert {rid: r.token_ids for rid, r in plain.generate(requests()).items()} == tokens
    spec = SpeculationConfig(enabled=True, method="ngram", max_draft_tokens=4)
    controller = SpeculationController(spec.model_copy(update={"adaptive": False}))
    fast = make_engine(gemma, weights=fmt, speculation=spec, controller=controller).generate(requests())
    assert sum(r.spec.drafted for r in fast.values()) > 0
    assert {rid: r.token_ids for rid, r in fast.items()} == tokens
