"""The EAGLE draft head: training on a tiny model, lossless serving, refusal of foreign or damaged heads."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from engine.config import SpeculationConfig
from engine.request import EngineRequest, SamplingOptions
from engine.speculative.eagle import EagleProposer
from engine.speculative.eagle_artifact import (
    DraftHeadError,
    DraftHeadMismatch,
    HeadMeta,
    load_head,
    save_head,
)
from engine.speculative.eagle_eval import acceptance_by_position
from engine.speculative.eagle_head import target_fingerprint
from engine.speculative.eagle_train import (
    TrainConfig,
    TrainExample,
    collect_features,
    train_head,
)
from engine.speculative.proposer import ProposalInput
from tests.unit.engine._engine_factories import (
    greedy_request,
    loaded_from_hf,
    make_engine,
    random_prompts,
    single_thread,  # noqa: F401 - the fixture, used through pytestmark
    tiny_hf_model,
)

pytestmark = pytest.mark.usefixtures("single_thread")
K = 4


def _quiet(_: str) -> None:
    pass


@pytest.fixture(scope="module")
def hf():  # type: ignore[no-untyped-def]
    return tiny_hf_model()


@pytest.fixture(scope="module")
def examples(hf) -> list[TrainExample]:  # type: ignore[no-untyped-def]
    """The tiny target's own greedy answers to a few random prompts, with its hidden states."""
    prompts = random_prompts([5, 7, 9, 6, 8, 5], seed=3)
    outs = make_engine(hf).generate([greedy_request(f"r{i}", p, 30) for i, p in enumerate(prompts)])
    seqs = [(p + outs[f"r{i}"].token_ids, len(p)) for i, p in enumerate(prompts)]
    return collect_features(loaded_from_hf(hf).model, seqs, _quiet)


@pytest.fixture(scope="module")
def head_dir(hf, examples, tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    target = loaded_from_hf(hf).model
    head, figures = train_head(target, examples[1:], TrainConfig(epochs=3, batch_tokens=256), _quiet)
    meta = HeadMeta("tiny", target_fingerprint(target), target.cfg.hidden_size, head.vocab_size, "v1", train=figures)
    root = tmp_path_factory.mktemp("heads")
    save_head(root / "tiny" / "v1", head, meta)
    return root / "tiny"


def _eagle(head: Path | str, lookup: bool = False, **kw: object) -> SpeculationConfig:
    return SpeculationConfig(enabled=True, method="eagle", draft_head=str(head), max_draft_tokens=K, adaptive=False,
                             eagle_prompt_lookup=lookup, **kw)


def test_training_a_tiny_head_runs_end_to_end_in_seconds(hf, examples, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    target = loaded_from_hf(hf).model
    start = time.perf_counter()
    head, figures = train_head(target, examples[1:], TrainConfig(epochs=2, batch_tokens=256), _quiet)
    acc = acceptance_by_position(head, target, examples[:1], K, _quiet)
    meta = HeadMeta("tiny", target_fingerprint(target), 64, head.vocab_size, "v2", train=figures,
                    acceptance_by_position=acc.by_position())
    folder = save_head(tmp_path / "v2", head, meta)
    loaded, read = load_head(str(folder), target, "tiny")
    assert time.perf_counter() - start < 30
    assert sum(acc.tested) > 0 and len(read.acceptance_by_position) == K
    assert torch.equal(loaded.draft_vocab, head.draft_vocab)


def _head_and_proposer(hf, head_dir: Path, ex: TrainExample):  # type: ignore[no-untyped-def]
    """The head, a proposer shown ex's features with a head KV region ready (its sequence state), and the
    training forward's inputs: embeddings e(x_{j+1}) [n, H] and concat(f_j, e(x_{j+1})) [n, 2H]."""
    target = loaded_from_hf(hf).model
    head, _ = load_head(str(head_dir), target, "tiny")
    n = len(ex.tokens) - 1
    emb = target.embed_tokens(ex.tokens[1:])  # [n, H]
    proposer = EagleProposer(head, target, kv_cache_tokens=n + 8, max_draft_tokens=K)
    proposer.observe_hidden("s", 0, ex.features[:n])
    st = proposer._seqs["s"]
    st.slot = proposer.kv_cache.allocate(n + 2)
    return head, proposer, st, emb, torch.cat([ex.features[:-1], emb], dim=-1)


def test_the_flat_serving_forward_equals_the_batched_training_forward(hf, head_dir: Path, examples) -> None:  # type: ignore[no-untyped-def]
    ex = examples[0]
    head, proposer, st, _, x = _head_and_proposer(hf, head_dir, ex)
    n, target = x.shape[0], proposer.target
    with torch.no_grad():
        batched = head.forward_train(x[None], target.rope_cos[:n], target.rope_sin[:n])[0]  # [n, H]
    # Fed one pair at a time, as a decode would, the head's KV must give the same outputs.
    with torch.inference_mode():
        flat = torch.cat([proposer._forward([(st, [int(ex.tokens[j + 1])], ex.features[j : j + 1])]) for j in range(n)])
    torch.testing.assert_close(flat, batched, atol=1e-4, rtol=1e-4)


def test_the_rollout_training_forward_equals_the_serving_drafts_at_every_depth(hf, head_dir: Path, examples) -> None:  # type: ignore[no-untyped-def]
    ex = examples[0]
    head, proposer, st, emb, x = _head_and_proposer(hf, head_dir, ex)
    n, target = x.shape[0], proposer.target
    with torch.no_grad():
        outs = head.forward_rollout(x[None], emb[None], target.rope_cos[:n], target.rope_sin[:n], depth=3)  # 3 x [1, n, H]
    c = n - 4  # committed x_0..x_c: the head has pairs 0..c-1, then drafts (when right) x_{c+1}, x_{c+2}
    tokens = [int(t) for t in ex.tokens]
    with torch.inference_mode():
        g = proposer._forward([(st, tokens[1 : c + 1], ex.features[:c])])  # depth 1 at position c - 1
        torch.testing.assert_close(g[0], outs[0][0, c - 1], atol=1e-4, rtol=1e-4)
        for depth in (2, 3):  # the chain's next pair: (its own guess, the draft) at the next position
            j = c - 2 + depth
            g = proposer._forward([(st, [tokens[j + 1]], g)])
            torch.testing.assert_close(g[0], outs[depth - 1][0, j], atol=1e-4, rtol=1e-4)


def test_a_head_trained_on_its_own_rollouts_trains_and_drafts(hf, examples) -> None:  # type: ignore[no-untyped-def]
    target = loaded_from_hf(hf).model
    head, figures = train_head(target, examples[1:], TrainConfig(epochs=1, batch_tokens=256, rollout=3), _quiet)
    acc = acceptance_by_position(head, target, examples[:1], K, _quiet)
    assert figures["train_seconds"] > 0 and sum(acc.tested) > 0
    with pytest.raises(ValueError, match="rollout"):
        TrainConfig(rollout=0)


def _generate(engine, prompts: list[list[int]], sampling: SamplingOptions) -> dict[str, list[int]]:  # type: ignore[no-untyped-def]
    reqs = [EngineRequest(f"r{i}", p, sampling) for i, p in enumerate(prompts)]
    return {rid: acc.token_ids for rid, acc in engine.generate(reqs).items()}


@pytest.mark.parametrize("max_batched_tokens", [512, 8])  # 8: prompts prefill in chunks
def test_greedy_batched_output_with_the_head_equals_plain_token_for_token(hf, head_dir: Path, max_batched_tokens: int) -> None:  # type: ignore[no-untyped-def]
    prompts = random_prompts([5, 9, 12, 7], seed=11)
    sampling = SamplingOptions(max_tokens=40, ignore_eos=True)
    plain = _generate(make_engine(hf), prompts, sampling)
    engine = make_engine(hf, speculation=_eagle(head_dir), max_batched_tokens=max_batched_tokens)
    reqs = [EngineRequest(f"r{i}", p, sampling) for i, p in enumerate(prompts)]
    result = engine.generate(reqs)
    assert {rid: acc.token_ids for rid, acc in result.items()} == plain
    assert sum(acc.spec.drafted for acc in result.values()) > 0  # the head really drafted


def test_seeded_sampling_with_the_head_equals_plain_token_for_token(hf, head_dir: Path) -> None:  # type: ignore[no-untyped-def]
    prompts = random_prompts([6, 10, 8], seed=12)
    for seed in (1, 2):
        sampling = SamplingOptions(max_tokens=30, temperature=0.9, top_p=0.95, seed=seed, ignore_eos=True)
        plain = _generate(make_engine(hf), prompts, sampling)
        assert _generate(make_engine(hf, speculation=_eagle(head_dir)), prompts, sampling) == plain


def test_the_adaptive_controller_keeps_the_output_of_plain(hf, head_dir: Path) -> None:  # type: ignore[no-untyped-def]
    prompts = random_prompts([5, 9, 12, 7], seed=13)
    sampling = SamplingOptions(max_tokens=30, ignore_eos=True)
    spec = SpeculationConfig(enabled=True, method="eagle", draft_head=str(head_dir), max_draft_tokens=K)
    assert _generate(make_engine(hf, speculation=spec), prompts, sampling) == _generate(make_engine(hf), prompts, sampling)


def test_prompt_lookup_with_the_head_keeps_the_output_of_plain_and_drafts_by_both(hf, head_dir: Path) -> None:  # type: ignore[no-untyped-def]
    from engine.speculative.combined import LookupThenEagle

    # Repeated runs in the prompt give lookup matches; the rest is left to the head.
    prompts = [p * 3 for p in random_prompts([6, 8], seed=14)] + random_prompts([7], seed=15)
    sampling = SamplingOptions(max_tokens=40, ignore_eos=True)
    engine = make_engine(hf, speculation=_eagle(head_dir, lookup=True))
    assert isinstance(engine.proposer, LookupThenEagle)
    assert _generate(engine, prompts, sampling) == _generate(make_engine(hf), prompts, sampling)


def test_suffix_beside_lookup_and_the_head_keeps_the_output_of_plain_and_drafts_repeats(hf, head_dir: Path) -> None:  # type: ignore[no-untyped-def]
    from engine.speculative.combined import LookupThenEagle

    prompts = random_prompts([7, 9, 6], seed=17)
    sampling = SamplingOptions(max_tokens=40, ignore_eos=True)
    plain = _generate(make_engine(hf), prompts, sampling)
    engine = make_engine(hf, speculation=_eagle(head_dir, lookup=True, eagle_suffix=True))
    assert isinstance(engine.proposer, LookupThenEagle) and engine.proposer.suffix is not None
    assert [name for name, _ in engine.proposer.matchers] == ["suffix", "lookup"]
    asked: list[int] = []
    real = engine.proposer.suffix.propose

    def counted(inputs, num_tokens):  # type: ignore[no-untyped-def]
        out = real(inputs, num_tokens)
        asked.extend(p.num_tokens for p in out)
        return out

    engine.proposer.suffix.propose = counted  # type: ignore[method-assign]
    assert _generate(engine, prompts, sampling) == plain
    first = sum(asked)
    assert _generate(engine, prompts, sampling) == plain  # the same requests again: their outputs are indexed
    assert sum(asked) - first > first  # the repeats drafted from the first round's outputs


@pytest.mark.parametrize("weights", ["fp32", "int4", "int8"])
def test_beside_any_target_format_the_head_serves_int8_and_the_output_stays_plains(hf, head_dir: Path, weights: str) -> None:  # type: ignore[no-untyped-def]
    from engine.quant.linear import QuantizedLinear
    from engine.speculative.combined import LookupThenEagle

    prompts = random_prompts([5, 9, 12], seed=16)
    sampling = SamplingOptions(max_tokens=30, ignore_eos=True)
    # Without the bf16 copy for wide steps: a batch's verification passes 9 rows, where the copy would round
    # other than the quantized kernel its plain steps run (54e26a1:docs/benchmarks.md, weight formats).
    engine = make_engine(hf, weights=weights, prepack_weights=False, speculation=_eagle(head_dir, lookup=True))
    assert isinstance(engine.proposer, LookupThenEagle)
    head = engine.proposer.eagle.head
    linears = [m for m in head.modules() if isinstance(m, torch.nn.Linear)]
    assert linears == [] and head.head_weight is None  # no float copy left beside the format's
    assert {m.fmt for m in head.modules() if isinstance(m, QuantizedLinear)} == {"int8"}  # int4 lost acceptance
    assert isinstance(head.head_matmul, QuantizedLinear) and isinstance(head.fc, QuantizedLinear)
    result = engine.generate([EngineRequest(f"r{i}", p, sampling) for i, p in enumerate(prompts)])
    plain = _generate(make_engine(hf, weights=weights, prepack_weights=False), prompts, sampling)
    assert {rid: acc.token_ids for rid, acc in result.items()} == plain
    assert sum(acc.spec.drafted for acc in result.values()) > 0  # the head really drafted


def test_a_head_trained_for_another_target_is_refused_with_a_clear_message(head_dir: Path) -> None:
    other = tiny_hf_model(seed=5)  # same shapes, other weights
    with pytest.raises(DraftHeadMismatch, match=r"was trained for tiny \(fingerprint [0-9a-f]+\); this worker serves"):
        make_engine(other, speculation=_eagle(head_dir))


def test_a_truncated_head_file_fails_at_load(hf, head_dir: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    broken = _copy(head_dir / "v1", tmp_path / "broken")
    data = (broken / "head.safetensors").read_bytes()
    (broken / "head.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(DraftHeadError, match=r"head.safetensors are unreadable \(truncated\?\)"):
        make_engine(hf, speculation=_eagle(broken))


def test_a_head_file_of_other_shapes_fails_at_load(hf, head_dir: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from safetensors.torch import load_file, save_file

    broken = _copy(head_dir / "v1", tmp_path / "shapes")
    tensors = load_file(str(broken / "head.safetensors"))
    tensors["fc.weight"] = tensors["fc.weight"][:, :10].contiguous()
    save_file(tensors, str(broken / "head.safetensors"))
    with pytest.raises(DraftHeadError, match="do not fit the target"):
        make_engine(hf, speculation=_eagle(broken))


def test_a_missing_head_or_a_config_of_another_format_fails_at_load(hf, head_dir: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(DraftHeadError, match="no config.json"):
        make_engine(hf, speculation=_eagle(tmp_path / "nothing-here"))
    other = _copy(head_dir / "v1", tmp_path / "format")
    meta = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**meta, "format": "something/9"}))
    with pytest.raises(DraftHeadError, match="has format 'something/9'"):
        make_engine(hf, speculation=_eagle(other))


def test_method_eagle_without_a_head_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="method 'eagle' needs draft_head"):
        SpeculationConfig(enabled=True, method="eagle")


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


# ---------------------------------------------------------------- lookup beside the head

PREFIX = list(range(10, 30))  # 20 distinct tokens: no match anywhere in it


def _lookup_then_eagle(hf, head_dir: Path, tokens: list[int]):  # type: ignore[no-untyped-def]
    """The combined proposer (lookup as method ngram's defaults) over `tokens`, the head shown the target's
    features of all of them (features are causal: showing later ones early changes nothing), and the head's calls."""
    from engine.speculative.combined import LookupThenEagle
    from engine.speculative.ngram import NgramProposer

    target = loaded_from_hf(hf).model
    head, _ = load_head(str(head_dir), target, "tiny")
    eagle = EagleProposer(head, target, kv_cache_tokens=256, max_draft_tokens=K)
    combined = LookupThenEagle(eagle, NgramProposer(1, 4))
    combined.observe_hidden("s", 0, collect_features(target, [(tokens, 0)], _quiet)[0].features)
    head_calls: list[int] = []
    real = eagle.propose

    def counted(inputs, num_tokens):  # type: ignore[no-untyped-def]
        head_calls.append(len(inputs))
        return real(inputs, num_tokens)

    eagle.propose = counted  # type: ignore[method-assign]
    return combined, head_calls


def _draft(combined, tokens: list[int]) -> list[int]:  # type: ignore[no-untyped-def]
    return combined.propose([ProposalInput("s", tokens, SamplingOptions(max_tokens=64))], [K])[0].tokens


def test_a_one_token_lookup_match_takes_the_step_from_the_head(hf, head_dir: Path) -> None:  # type: ignore[no-untyped-def]
    tokens = PREFIX + [15]  # 15 occurred once, followed by 16..
    combined, head_calls = _lookup_then_eagle(hf, head_dir, tokens)
    assert combined.source(ProposalInput("s", tokens, SamplingOptions(max_tokens=64))) == "lookup"
    assert _draft(combined, tokens) == [16, 17, 18, 19] and head_calls == []


def test_the_head_drafts_where_lookup_finds_no_match(hf, head_dir: Path) -> None:  # type: ignore[no-untyped-def]
    combined, head_calls = _lookup_then_eagle(hf, head_dir, PREFIX)
    assert combined.source(ProposalInput("s", PREFIX, SamplingOptions(max_tokens=64))) == "head"
    assert len(_draft(combined, PREFIX)) == K and head_calls == [1]
