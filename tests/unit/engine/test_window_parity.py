"""Sliding windows shorter than the sequences (every layer of mistral, phi3 and mixtral; qwen2's upper layers) are
applied as transformers applies them: our decoder and engine equal HF past the window, and the context is the
model's, not the window."""
from __future__ import annotations

from typing import Any

import pytest
import torch
from _engine_factories import (
    every_format_runs,  # noqa: F401  (fixture)
    hf_greedy,
    make_engine,
    random_prompts,
    single_thread,  # noqa: F401  (fixture)
    tiny_hf_model,
)
from test_model_parity import cache_for, hf_logits, run_chunks

from engine.config import SpeculationConfig
from engine.model import Decoder, DecoderConfig
from engine.request import EngineRequest, SamplingOptions
from engine.speculative.controller import SpeculationController

pytestmark = pytest.mark.usefixtures("single_thread")

WINDOW = 8  # shorter than every sequence below
KINDS = ["mistral", "phi3", "mixtral", "qwen2"]


def windowed(kind: str, **overrides: Any) -> Any:
    if kind == "qwen2":  # Qwen2Config makes layers from max_window_layers on sliding when use_sliding_window
        overrides = {"use_sliding_window": True, "max_window_layers": 1} | overrides
    return tiny_hf_model(kind, sliding_window=WINDOW, **overrides)


@pytest.mark.parametrize(("kind", "windows"), [
    ("mistral", (WINDOW, WINDOW)), ("phi3", (WINDOW, WINDOW)), ("mixtral", (WINDOW, WINDOW)), ("qwen2", (None, WINDOW)),
])
def test_each_layer_has_the_window_transformers_gives_it_and_the_context_stays_the_models(
        kind: str, windows: tuple[int | None, ...]) -> None:
    hf = windowed(kind)
    cfg = DecoderConfig.from_hf(hf.config)
    assert cfg.layer_windows == windows
    assert cfg.max_position_embeddings == hf.config.max_position_embeddings


@pytest.mark.parametrize("kind", KINDS)
def test_logits_past_the_window_match_hf_in_one_flat_batch(kind: str) -> None:
    hf = windowed(kind)
    a, b, c = random_prompts([17, 9, 1], seed=11)
    got = run_chunks(Decoder.from_hf(hf, 256), cache_for(hf), [(0, a, 0), (100, b, 0), (200, c, 0)])
    ref = torch.cat([hf_logits(hf, a), hf_logits(hf, b), hf_logits(hf, c)])
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_chunks_and_decodes_past_the_window_match_hf(kind: str) -> None:
    hf = windowed(kind)
    model, cache = Decoder.from_hf(hf, 256), cache_for(hf)
    ids = random_prompts([30], seed=12)[0]
    rows = [run_chunks(model, cache, [(40, ids[0:11], 0)]), run_chunks(model, cache, [(40, ids[11:23], 11)])]
    rows += [run_chunks(model, cache, [(40, [ids[i]], i)]) for i in range(23, 30)]
    torch.testing.assert_close(torch.cat(rows), hf_logits(hf, ids), atol=1e-4, rtol=0)


def test_the_window_changes_the_logits_of_rows_past_it() -> None:
    """Without the window the rows past it differ: the parity above needs it applied."""
    hf, wide = windowed("mistral"), tiny_hf_model("mistral", sliding_window=None)
    wide.load_state_dict(hf.state_dict())
    ids = random_prompts([20], seed=13)[0]
    ours = run_chunks(Decoder.from_hf(hf, 256), cache_for(hf), [(0, ids, 0)])
    unwindowed = hf_logits(wide, ids)
    torch.testing.assert_close(ours[:WINDOW], unwindowed[:WINDOW], atol=1e-4, rtol=0)
    assert (ours[WINDOW:] - unwindowed[WINDOW:]).abs().max() > 1e-2


PROMPTS = random_prompts([7, 15, 21], seed=14) + [random_prompts([5], seed=15)[0] * 4]  # the last: n-gram matches
MAX_TOKENS = 16


def requests() -> list[EngineRequest]:
    params = SamplingOptions(max_tokens=MAX_TOKENS, ignore_eos=True)
    return [EngineRequest(f"r{i}", p, params) for i, p in enumerate(PROMPTS)]


def ngram_engine(hf: Any, **kw: Any) -> Any:
    spec = SpeculationConfig(enabled=True, method="ngram", max_draft_tokens=4)
    controller = SpeculationController(spec.model_copy(update={"adaptive": False}))
    return make_engine(hf, speculation=spec, controller=controller, **kw)


@pytest.mark.parametrize("kind", ["mistral", "qwen2"])
def test_greedy_and_ngram_speculation_through_the_engine_equal_hf_generate(kind: str) -> None:
    hf = windowed(kind)
    reference = {f"r{i}": hf_greedy(hf, p, MAX_TOKENS) for i, p in enumerate(PROMPTS)}
    # A small token budget chunks the prompts, so chunks attend to cached prefixes past the window.
    plain = make_engine(hf, max_batched_tokens=6).generate(requests())
    assert {rid: r.token_ids for rid, r in plain.items()} == reference
    fast = ngram_engine(hf).generate(requests())
    assert sum(r.spec.drafted for r in fast.values()) > 0
    assert {rid: r.token_ids for rid, r in fast.items()} == reference


@pytest.mark.usefixtures("every_format_runs")
@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_a_window_narrower_than_max_model_len_runs_on_the_fused_step_with_the_layer_by_layer_tokens(fmt: str) -> None:
    hf = windowed("mistral")
    plain = make_engine(hf, weights=fmt)
    assert plain.weight_format == fmt and plain.model.fused_step is not None
    layer_by_layer = make_engine(hf, weights=fmt, fused_step=False).generate(requests())
    assert {rid: r.token_ids for rid, r in plain.generate(requests()).items()} == {
        rid: r.token_ids for rid, r in layer_by_layer.items()}
    fast = ngram_engine(hf, weights=fmt).generate(requests())
    assert sum(r.spec.drafted for r in fast.values()) > 0
    assert {rid: r.token_ids for rid, r in fast.items()} == {rid: r.token_ids for rid, r in layer_by_layer.items()}


@pytest.mark.usefixtures("every_format_runs")
def test_a_window_no_sequence_can_outgrow_leaves_the_fused_step_in_place() -> None:
    """max_model_len (plus the drafts' rows) within the window: no row's view ever narrows, so nothing changes."""
    hf = tiny_hf_model("mistral", sliding_window=64)
    engine = make_engine(hf, weights="int4", max_model_len=48)
    assert engine.model.fused_step is not None
    assert {rid: r.token_ids for rid, r in engine.generate(requests()).items()} == {
        rid: r.token_ids for rid, r in make_engine(hf, weights="int4", max_model_len=48, fused_step=False)
        .generate(requests()).items()}
