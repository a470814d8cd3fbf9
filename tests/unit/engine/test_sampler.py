"""engine.sampler: position-keyed randomness, target distribution, sampling."""
from __future__ import annotations

import pytest
import torch

from _stats import _single_thread, chisquare_pvalue  # noqa: F401 (fixture)

from engine.request import SamplingOptions
from engine.sampler import (
    STREAM_ACCEPT,
    STREAM_SAMPLE,
    RequestRng,
    derive_keys,
    exponential_noise,
    mix32,
    sample_batch,
    sample_next,
    target_probs,
    uniform_noise,
    uniforms,
)

GREEDY = SamplingOptions(temperature=0.0)
T1 = SamplingOptions(temperature=1.0)


# ---------------------------------------------------------------- RequestRng


def _reference_uniform(rng: RequestRng, position: int, stream: int, index: int) -> float:
    """Pure-Python twin of uniform_noise for one element: pins the hash down."""
    key = rng.key(position, stream)
    k1, k2 = derive_keys(key.base, key.position, key.stream)
    x = ((index * 0x9E3779B9) + k1) & 0xFFFFFFFF
    x = mix32(x ^ k2)
    x = mix32(x ^ k1)
    return (((x >> 9) & 0x7FFFFF) + 0.5) * 2.0**-23


def test_noise_matches_python_reference_bit_for_bit() -> None:
    rng = RequestRng(1234)
    u = uniform_noise([rng.key(7, STREAM_SAMPLE)], 1000)[0]
    for i in (0, 1, 2, 500, 999):
        assert u[i].item() == _reference_uniform(rng, 7, STREAM_SAMPLE, i)
    assert rng.uniform(7, STREAM_SAMPLE) == u[0].item()
    # The element-0 shortcut agrees too, for many keys at once.
    keys = [rng.key(p, s) for p in (0, 1, 2**31 + 3, 2**32 - 1) for s in (STREAM_SAMPLE, STREAM_ACCEPT)]
    assert uniforms(keys).tolist() == [rng.uniform(k.position, k.stream) for k in keys]


def test_noise_depends_only_on_seed_position_and_stream() -> None:
    a, b = RequestRng(42), RequestRng(42)
    # Draw in different orders and amounts: position-keyed, not stateful.
    a.exponentials([0, 1, 2, 3], 64)
    first = a.exponentials([5], 64)
    second = b.exponentials([5], 64)
    assert torch.equal(first, second)
    assert not torch.equal(a.exponentials([5], 64), a.exponentials([6], 64))
    assert not torch.equal(a.exponentials([5], 64, stream=STREAM_SAMPLE), a.exponentials([5], 64, stream=STREAM_ACCEPT))
    assert not torch.equal(RequestRng(43).exponentials([5], 64), first)


def test_seed_none_draws_a_seed_once() -> None:
    rng = RequestRng(None)
    assert isinstance(rng.seed, int)
    assert torch.equal(rng.exponentials([3], 16), RequestRng(rng.seed).exponentials([3], 16))
    assert RequestRng(None).seed != rng.seed  # 63 random bits


def test_large_and_negative_seeds_fold() -> None:
    for seed in (-1, 2**70 + 5, 0):
        e = RequestRng(seed).exponentials([0, 1], 32)
        assert torch.isfinite(e).all() and (e > 0).all()


def test_the_noise_is_unit_exponential_and_uncorrelated_across_tokens_and_positions() -> None:
    rng = RequestRng(7)
    e = exponential_noise([rng.key(p) for p in range(64)], 4096).double()  # [64, 4096]
    assert torch.isfinite(e).all() and (e > 0).all()
    assert abs(e.mean().item() - 1.0) < 0.01
    assert abs(e.var().item() - 1.0) < 0.03
    # Neighbouring tokens and neighbouring positions are uncorrelated.
    corr_tok = torch.corrcoef(torch.stack([e[:, :-1].flatten(), e[:, 1:].flatten()]))[0, 1].item()
    corr_pos = torch.corrcoef(torch.stack([e[:-1].flatten(), e[1:].flatten()]))[0, 1].item()
    assert abs(corr_tok) < 0.01 and abs(corr_pos) < 0.01


def test_out_of_range_position_is_refused() -> None:
    with pytest.raises(ValueError, match="position"):
        RequestRng(1).key(-1)
    with pytest.raises(ValueError, match="position"):
        RequestRng(1).key(2**32)


# ---------------------------------------------------------------- target_probs


def test_temperature_scales_logits() -> None:
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    p = target_probs(logits, SamplingOptions(temperature=0.5))
    assert torch.allclose(p, torch.softmax(logits / 0.5, dim=-1))


def test_greedy_is_one_hot_argmax() -> None:
    logits = torch.tensor([[0.1, 3.0, 0.2], [5.0, 1.0, 2.0]])
    p = target_probs(logits, GREEDY)
    assert p.tolist() == [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]


def test_top_k_keeps_k_largest() -> None:
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0, 2.0]])
    p = target_probs(logits, SamplingOptions(temperature=1.0, top_k=2))
    assert (p[0] > 0).tolist() == [False, True, False, True, False]
    assert torch.allclose(p[0, [1, 3]], torch.softmax(torch.tensor([5.0, 4.0]), dim=-1))


def test_top_p_keeps_smallest_set_reaching_p() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().unsqueeze(0)
    p = target_probs(logits, SamplingOptions(temperature=1.0, top_p=0.7))
    assert (p[0] > 0).tolist() == [True, True, False, False]  # 0.5 < 0.7 <= 0.8
    assert torch.allclose(p[0, :2], torch.tensor([0.5, 0.3]) / 0.8)
    p = target_probs(logits, SamplingOptions(temperature=1.0, top_p=0.1))
    assert (p[0] > 0).tolist() == [True, False, False, False]  # the top token always stays


def test_each_row_is_sampled_with_its_own_parameters() -> None:
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0]] * 3)
    p = target_probs(logits, [GREEDY, SamplingOptions(temperature=1.0, top_k=1), T1])
    assert p[0].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert p[1].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert torch.allclose(p[2], torch.softmax(logits[2], dim=-1))
    with pytest.raises(ValueError):
        target_probs(logits, [T1, T1])


# ---------------------------------------------------------------- sampling


def test_greedy_sampling_is_argmax_without_rng() -> None:
    logits = torch.randn(50)
    assert sample_next(logits, GREEDY, None, 0) == int(logits.argmax())


def test_sampling_without_rng_is_refused() -> None:
    with pytest.raises(ValueError, match="RequestRng"):
        sample_next(torch.randn(5), T1, None, 0)


def test_sample_is_position_keyed_and_batch_independent() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 100, generator=gen)
    rng = RequestRng(99)
    alone = [sample_next(logits[i], T1, rng, 10 + i) for i in range(6)]
    # Same rows inside a batch with other requests, greedy and sampled, in another order.
    others = [RequestRng(s) for s in range(6)]
    batch_logits = torch.cat([logits, torch.randn(6, 100, generator=gen)])
    params = [T1] * 6 + [GREEDY, T1, T1, GREEDY, T1, T1]
    rngs: list[RequestRng | None] = [rng] * 6 + others
    positions = [10 + i for i in range(6)] + [0, 1, 2, 3, 4, 5]
    perm = torch.randperm(12, generator=gen).tolist()
    out = sample_batch(
        batch_logits[perm], [params[i] for i in perm], [rngs[i] for i in perm], [positions[i] for i in perm]
    )
    by_row = dict(zip(perm, out))
    assert [by_row[i] for i in range(6)] == alone


def test_sample_distribution_matches_target() -> None:
    p = torch.tensor([0.3, 0.2, 0.15, 0.1, 0.1, 0.08, 0.05, 0.02])
    n = 20000
    logits = p.log().expand(n, -1)
    rngs: list[RequestRng | None] = [RequestRng(s) for s in range(n)]
    toks = sample_batch(logits, [T1] * n, rngs, [3] * n)
    counts = torch.bincount(torch.tensor(toks), minlength=8)
    assert chisquare_pvalue(counts, p) > 1e-3
    # The same seeds over positions of one request are just as well distributed.
    one = RequestRng(5)
    toks = sample_batch(logits, [T1] * n, [one] * n, list(range(n)))
    assert chisquare_pvalue(torch.bincount(torch.tensor(toks), minlength=8), p) > 1e-3


def test_chisquare_helper_rejects_wrong_distribution() -> None:
    p = torch.tensor([0.5, 0.5])
    assert chisquare_pvalue(torch.tensor([10100, 9900]), p) > 1e-3
    assert chisquare_pvalue(torch.tensor([11000, 9000]), p) < 1e-6
