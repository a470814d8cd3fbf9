"""engine.speculative.draft_model: tokenizer checks, KV catch-up / rollback, drafting modes."""
from __future__ import annotations

import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.config import SpeculationConfig
from engine.model import Decoder
from engine.request import SamplingOptions
from engine.sampler import RequestRng, sample_next
from engine.speculative.config import SpeculationTuning
from engine.speculative.draft_model import DraftModelMismatch, DraftModelProposer, check_draft_compatible
from engine.speculative.proposer import ProposalInput, Proposer
from engine.speculative.verifier import verify

V = 64
GREEDY = SamplingOptions(temperature=0.0, max_tokens=64)
T1 = SamplingOptions(temperature=1.0, max_tokens=64)


@pytest.fixture(autouse=True, scope="module")
def _single_thread() -> Iterator[None]:
    """Many tiny forwards: on 2 shared cores intra-op threads only add waiting."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make_tokenizer(size: int, swap: tuple[int, int] | None = None, eos: str = "</s>") -> Any:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(3, size)]
    if swap is not None:
        a, b = swap
        words[a], words[b] = words[b], words[a]
    tok = Tokenizer(WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token=eos)


def tiny_llama(vocab: int = V, seed: int = 0) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        initializer_range=0.2,  # logits far apart: greedy never hinges on a near tie
        bos_token_id=1,
        eos_token_id=2,
    )
    return LlamaForCausalLM(cfg).eval()


def perturbed(hf: Any, scale: float, seed: int = 1) -> Any:
    """A copy of hf with noise on every weight: a draft that agrees often, not always."""
    import copy

    out = copy.deepcopy(hf)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale * p.std())
    return out


def proposer_for(draft_hf: Any, cfg: SpeculationConfig | None = None, kv_tokens: int = 4096) -> DraftModelProposer:
    model = Decoder.from_hf(draft_hf, max_positions=256)
    cfg = cfg or SpeculationConfig(max_draft_tokens=6)
    return DraftModelProposer(model, cfg, target_vocab_size=V, kv_cache_tokens=kv_tokens)


@torch.inference_mode()
def hf_next_logits(hf: Any, ctx: list[int]) -> torch.Tensor:
    """The model's next-token logits [V] after ctx, always from a full forward of ctx alone
    (same computation for plain and speculative runs, so bit-identical)."""
    return hf(input_ids=torch.tensor([ctx])).logits[0, -1].float()


def hf_greedy(hf: Any, ctx: list[int], n: int) -> list[int]:
    out: list[int] = []
    for _ in range(n):
        out.append(int(hf_next_logits(hf, ctx + out).argmax()))
    return out


# ---------------------------------------------------------------- compatibility


def test_different_vocab_size_is_refused_with_a_clear_message() -> None:
    with pytest.raises(DraftModelMismatch) as e:
        check_draft_compatible("target-T", make_tokenizer(64), 64, "draft-D", make_tokenizer(80), 80)
    assert str(e.value) == (
        "draft model draft-D has vocab 80 tokens, target target-T has 64: a draft must share the target's tokenizer"
    )


def test_same_size_different_mapping_is_refused() -> None:
    msg = r"draft model D maps token 'w10' to id 20, target T to id 10 \(2 tokens differ\)"
    with pytest.raises(DraftModelMismatch, match=msg):
        check_draft_compatible("T", make_tokenizer(64), 64, "D", make_tokenizer(64, swap=(10, 20)), 64)


def test_different_special_tokens_are_refused() -> None:
    with pytest.raises(DraftModelMismatch, match="eos_token_id 3, target T has 2"):
        check_draft_compatible("T", make_tokenizer(64), 64, "D", make_tokenizer(64, eos="w3"), 64)


def test_without_tokenizers_a_draft_is_checked_by_vocabulary_size() -> None:
    with pytest.raises(DraftModelMismatch, match="draft model D has vocab 72 tokens, target T has 64"):
        check_draft_compatible("T", object(), 64, "D", object(), 72)
    check_draft_compatible("T", object(), 64, "D", object(), 64)


def test_padded_embeddings_with_the_same_tokenizer_are_accepted() -> None:
    tok = make_tokenizer(60)
    check_draft_compatible("T", tok, 64, "D", make_tokenizer(60), 72)
    with pytest.raises(DraftModelMismatch, match="embedding rows"):
        check_draft_compatible("T", tok, 64, "D", make_tokenizer(60), 48)


def _save(hf: Any, tok: Any, path: Path) -> str:
    hf.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def test_startup_refuses_a_draft_with_another_tokenizer(tmp_path: Path) -> None:
    from engine.loader import load_model

    target_dir = _save(tiny_llama(V), make_tokenizer(V), tmp_path / "target")
    # The bad draft has a config and a tokenizer but no weights: the check must
    # refuse it before loading any.
    bad = tmp_path / "bad"
    tiny_llama(80, seed=3).config.save_pretrained(bad)
    make_tokenizer(80).save_pretrained(bad)
    bad_dir = str(bad)
    good_dir = _save(perturbed(tiny_llama(V), 0.1), make_tokenizer(V), tmp_path / "good")
    target = load_model(target_dir, device="cpu", dtype="float32")
    msg = f"draft model {bad_dir} has vocab 80 tokens, target {target_dir} has 64"
    with pytest.raises(DraftModelMismatch, match=re.escape(msg)):
        DraftModelProposer.from_engine(SpeculationConfig(method="draft", draft_model=bad_dir), target)
    cfg = SpeculationConfig(method="draft", draft_model=good_dir)
    prop = DraftModelProposer.from_engine(cfg, target, max_model_len=128, max_running_requests=2,
                                          tuning=SpeculationTuning(draft_kv_cache_bytes=1 << 20))
    assert isinstance(prop, Proposer)
    assert prop.kv_cache.num_tokens == 2 * (128 + cfg.max_draft_tokens + 1)
    [out] = prop.propose([ProposalInput("a", [1, 5, 9], GREEDY, 3)], [3])
    assert len(out.tokens) == 3 and out.probs is None


# ---------------------------------------------------------------- drafting


def test_greedy_drafts_follow_the_draft_model_through_rollbacks() -> None:
    """Drafts must equal the draft model's own greedy continuation computed from
    scratch, step after step, although the target accepts only part of them:
    that checks catch-up, stale-KV detection and rollback. Two sequences of
    different lengths and draft lengths share every forward."""
    target = tiny_llama()
    draft_hf = perturbed(target, 0.35)
    prop = proposer_for(draft_hf)
    rnd = random.Random(0)
    ctxs = {"a": [1, 7, 3, 9, 4], "b": [1, 12, 40, 2, 33, 8, 8, 19, 5]}
    n_prompt = {s: len(c) for s, c in ctxs.items()}
    accepted = drafted = 0
    for _ in range(12):
        ks = [rnd.choice([1, 3, 6]), rnd.choice([2, 4])]
        inputs = [ProposalInput(s, list(ctxs[s]), GREEDY, n_prompt[s]) for s in ("a", "b")]
        outs = prop.propose(inputs, ks)
        for (s, k), out in zip(zip(("a", "b"), ks), outs):
            assert out.tokens == hf_greedy(draft_hf, ctxs[s], k)
            rows = torch.stack([hf_next_logits(target, ctxs[s] + out.tokens[:j]) for j in range(k + 1)])
            emitted = verify(rows, out, GREEDY, None, len(ctxs[s]) - n_prompt[s])
            assert emitted == hf_greedy(target, ctxs[s], len(emitted))  # lossless
            accepted += len(emitted) - 1
            drafted += k
            ctxs[s] += emitted
            prop.rollback(s, len(ctxs[s]))
    assert 0 < accepted < drafted  # partial acceptance: the rollback paths were exercised


def test_draft_equal_to_target_is_always_accepted() -> None:
    target = tiny_llama()
    prop = proposer_for(target)
    ctx = [1, 4, 4, 20]
    for _ in range(4):
        [out] = prop.propose([ProposalInput("s", list(ctx), GREEDY, 4)], [5])
        rows = torch.stack([hf_next_logits(target, ctx + out.tokens[:j]) for j in range(6)])
        emitted = verify(rows, out, GREEDY, None, len(ctx) - 4)
        assert len(emitted) == 6
        ctx += emitted
        prop.rollback("s", len(ctx))


def _sampled_run(target: Any, prop: DraftModelProposer | None, seed: int, n: int) -> tuple[list[int], int, int]:
    prompt = [1, 9, 17, 3]
    ctx = list(prompt)
    rng = RequestRng(seed)
    drafted = accepted = 0
    while len(ctx) - len(prompt) < n:
        pos = len(ctx) - len(prompt)
        if prop is None:
            ctx.append(sample_next(hf_next_logits(target, ctx), T1, rng, pos))
            continue
        [out] = prop.propose([ProposalInput("s", list(ctx), T1, len(prompt), rng)], [4])
        rows = torch.stack([hf_next_logits(target, ctx + out.tokens[:j]) for j in range(len(out.tokens) + 1)])
        emitted = verify(rows, out, T1, rng, pos)
        drafted += len(out.tokens)
        accepted += len(emitted) - 1
        ctx += emitted
        prop.rollback("s", len(ctx))
    return ctx[len(prompt) : len(prompt) + n], drafted, accepted


def test_coupled_drafting_matches_the_targets_own_samples() -> None:
    """Coupled drafts use the target's position-keyed noise: a draft equal to the
    target is accepted (almost) always at temperature 1, where greedy drafts
    would mostly fail, and the text equals plain seeded sampling."""
    target = tiny_llama()
    reference, _, _ = _sampled_run(target, None, seed=5, n=24)
    coupled, drafted, accepted = _sampled_run(target, proposer_for(target, SpeculationConfig(draft_sampling="coupled")), 5, 24)
    assert coupled == reference
    assert accepted >= 0.9 * drafted
    greedy, g_drafted, g_accepted = _sampled_run(target, proposer_for(target), 5, 24)
    assert greedy == reference  # still lossless, just fewer acceptances
    assert g_accepted / g_drafted < accepted / drafted


def test_sampled_drafting_returns_the_draft_probabilities_verification_needs() -> None:
    target = tiny_llama()
    prop = proposer_for(perturbed(target, 0.2), SpeculationConfig(draft_sampling="sampled"))
    ctx = [1, 9, 17, 3]
    rng = RequestRng(11)
    [out] = prop.propose([ProposalInput("s", ctx, T1, 4, rng)], [3])
    assert out.probs is not None and out.probs.shape == (3, V)
    assert torch.allclose(out.probs.sum(-1), torch.ones(3))
    assert all(out.probs[j, t] > 0 for j, t in enumerate(out.tokens))
    rows = torch.stack([hf_next_logits(target, ctx + out.tokens[:j]) for j in range(4)])
    emitted = verify(rows, out, T1, rng, 0)
    assert 1 <= len(emitted) <= 4 and emitted[:-1] == out.tokens[: len(emitted) - 1]
    # Greedy requests still draft deterministically.
    [g] = prop.propose([ProposalInput("g", ctx, GREEDY, 4)], [3])
    assert g.probs is None


def test_full_arena_means_no_drafts_and_release_frees() -> None:
    prop = proposer_for(tiny_llama(), kv_tokens=100)
    long_params = SamplingOptions(max_tokens=60)
    [a] = prop.propose([ProposalInput("a", [1, 2, 3], long_params, 3)], [2])
    assert len(a.tokens) == 2
    [b] = prop.propose([ProposalInput("b", [1, 2, 3], long_params, 3)], [2])
    assert b.tokens == []  # no room for b's region: it simply gets no drafts
    prop.release("a")
    [b] = prop.propose([ProposalInput("b", [1, 2, 3], long_params, 3)], [2])
    assert len(b.tokens) == 2


def test_context_end_limits_the_draft() -> None:
    prop = proposer_for(tiny_llama())
    ctx = [1] + [5] * 250  # 251 tokens; the draft model has 256 positions
    [out] = prop.propose([ProposalInput("s", ctx, SamplingOptions(max_tokens=100), 251)], [8])
    assert len(out.tokens) == 6  # positions 251..255 get fed, the 6th draft is never fed
