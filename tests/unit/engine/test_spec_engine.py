"""Speculation through the whole LLMEngine: a seeded request produces the same
tokens with speculation off, with the n-gram or draft-model proposer, with the
adaptive controller or fixed draft lengths, alone or in a batch. That is what
redelivery after a worker crash relies on."""
from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from _engine_factories import VOCAB, make_engine, random_prompts, tiny_hf_model

from engine.config import SpeculationConfig
from engine.model import Decoder
from engine.request import EngineRequest, SamplingOptions
from engine.speculative.controller import SpeculationController
from engine.speculative.draft_model import DraftModelProposer


@pytest.fixture(autouse=True, scope="module")
def _single_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def target() -> Any:
    return tiny_hf_model("llama")


PROMPTS = random_prompts([7, 15, 4, 12], seed=3)
PROMPTS[3] = PROMPTS[3][:6] * 3  # repetitive: the n-gram proposer finds matches
PARAMS = [
    SamplingOptions(max_tokens=24, temperature=0.9, top_p=0.95, seed=100, ignore_eos=True),
    SamplingOptions(max_tokens=24, temperature=0.0, ignore_eos=True),
    SamplingOptions(max_tokens=24, temperature=1.2, top_k=40, seed=102, ignore_eos=True),
    SamplingOptions(max_tokens=24, temperature=0.7, seed=103, ignore_eos=True),
]


def run(engine: Any, ids: range | list[int] = range(4)) -> tuple[dict[str, list[int]], int, int]:
    res = engine.generate([EngineRequest(f"r{i}", PROMPTS[i], PARAMS[i]) for i in ids])
    drafted = sum(r.spec.drafted for r in res.values())
    accepted = sum(r.spec.accepted for r in res.values())
    return {k: r.token_ids for k, r in res.items()}, drafted, accepted


@pytest.fixture(scope="module")
def reference(target: Any) -> dict[str, list[int]]:
    return run(make_engine(target))[0]


def draft_engine(target: Any, draft_hf: Any, mode: str, adaptive: bool) -> Any:
    spec = SpeculationConfig(enabled=True, method="draft", draft_model="tiny-draft", max_draft_tokens=4)
    cfg = spec.model_copy(update={"draft_sampling": mode, "adaptive": adaptive})
    proposer = DraftModelProposer(Decoder.from_hf(draft_hf, 512), cfg, VOCAB, kv_cache_tokens=4096)
    return make_engine(target, speculation=spec, proposer=proposer, controller=SpeculationController(cfg))


def test_batch_composition_does_not_change_tokens(target: Any, reference: dict[str, list[int]]) -> None:
    for i in range(4):
        assert run(make_engine(target), [i])[0][f"r{i}"] == reference[f"r{i}"]


@pytest.mark.parametrize("adaptive", [False, True], ids=["fixed-k", "adaptive"])
def test_ngram_speculation_keeps_seeded_tokens(target: Any, reference: dict[str, list[int]], adaptive: bool) -> None:
    spec = SpeculationConfig(enabled=True, method="ngram", max_draft_tokens=4)
    controller = SpeculationController(spec.model_copy(update={"adaptive": adaptive}))
    tokens, drafted, _ = run(make_engine(target, speculation=spec, controller=controller))
    assert tokens == reference
    assert drafted > 0


@pytest.mark.parametrize("mode", ["greedy", "coupled"])
def test_draft_model_speculation_keeps_seeded_tokens(target: Any, reference: dict[str, list[int]], mode: str) -> None:
    # A draft equal to the target: coupled drafts are all accepted, greedy ones
    # only for the greedy request; either way the tokens are the reference's.
    tokens, drafted, accepted = run(draft_engine(target, target, mode, adaptive=False))
    assert tokens == reference
    if mode == "coupled":
        assert accepted == drafted > 0
    # A different draft, with the adaptive controller deciding the lengths.
    other = copy.deepcopy(target)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.1 * p.std())
    assert run(draft_engine(target, other, mode, adaptive=True))[0] == reference
