"""engine.speculative.verifier: greedy edge cases, losslessness (chi-square) and reproducibility."""
from __future__ import annotations

import random

import pytest
import torch

from _stats import _single_thread, chisquare_pvalue  # noqa: F401 (fixture)

from engine.request import SamplingOptions
from engine.sampler import (
    STREAM_ACCEPT,
    STREAM_RESIDUAL,
    RequestRng,
    exponential_noise,
    race,
    sample_next,
)
from engine.speculative.proposer import DraftProposal
from engine.speculative.verifier import verify, verify_batch

GREEDY = SamplingOptions(temperature=0.0)
T1 = SamplingOptions(temperature=1.0)
V = 8
N_TRIALS = 20000


def one_hot_logits(tokens: list[int], vocab: int = V) -> torch.Tensor:
    """Logits [len, V] whose argmax is tokens[i] in row i."""
    out = torch.zeros(len(tokens), vocab)
    out[torch.arange(len(tokens)), torch.tensor(tokens)] = 5.0
    return out


# ---------------------------------------------------------------- greedy


def test_greedy_all_accepted_adds_bonus() -> None:
    logits = one_hot_logits([3, 1, 4, 6])  # target argmax after last, d1, d2, d3
    assert verify(logits, DraftProposal([3, 1, 4]), GREEDY, None, 0) == [3, 1, 4, 6]


def test_greedy_first_rejected_gives_correction() -> None:
    logits = one_hot_logits([3, 1, 4, 6])
    assert verify(logits, DraftProposal([2, 1, 4]), GREEDY, None, 0) == [3]


def test_greedy_a_rejection_mid_draft_keeps_the_accepted_prefix_and_adds_the_correction() -> None:
    logits = one_hot_logits([3, 1, 4, 6])
    assert verify(logits, DraftProposal([3, 1, 5]), GREEDY, None, 0) == [3, 1, 4]


def test_greedy_without_drafts_emits_the_targets_token() -> None:
    logits = one_hot_logits([5])
    assert verify(logits, DraftProposal([]), GREEDY, None, 0) == [5]


def test_greedy_ignores_draft_probs() -> None:
    logits = one_hot_logits([3, 1, 2])
    q = torch.full((2, V), 1.0 / V)
    assert verify(logits, DraftProposal([3, 1], q), GREEDY, None, 0) == [3, 1, 2]


def test_a_flat_batch_of_mixed_draft_lengths_and_sampling_is_verified_per_sequence() -> None:
    # Three sequences, k = 2, 0, 1, greedy and sampled, in one flat logits tensor.
    logits = torch.cat([one_hot_logits([1, 2, 3]), one_hot_logits([4]), one_hot_logits([5, 6])])
    rng = RequestRng(3)
    props = [DraftProposal([1, 2]), DraftProposal([]), DraftProposal([5])]
    params = [GREEDY, GREEDY, SamplingOptions(temperature=1.0, top_k=1)]
    out = verify_batch(logits, props, params, [None, None, rng], [0, 7, 2])
    assert out == [[1, 2, 3], [4], [5, 6]]


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="rows"):
        verify(one_hot_logits([1, 2]), DraftProposal([1, 2]), GREEDY, None, 0)
    with pytest.raises(ValueError, match="draft probs"):
        verify(torch.zeros(3, V), DraftProposal([1, 2], torch.ones(2, V + 1)), T1, RequestRng(1), 0)
    with pytest.raises(ValueError, match="RequestRng"):
        verify(torch.zeros(1, V), DraftProposal([]), T1, None, 0)


# ---------------------------------------------------------------- losslessness

# Fixed target and (deliberately different) draft distributions over V = 8.
_gen = torch.Generator().manual_seed(2024)
P_ROWS = torch.softmax(torch.randn(4, V, generator=_gen), dim=-1)  # [k+1, V] target p_0..p_3
Q_ROWS = torch.softmax(torch.randn(3, V, generator=_gen) * 1.5, dim=-1)  # [k, V] draft q_0..q_2
# A Markov "language model" for the two-position test: next ~ P_MC[last] (target), Q_MC[last] (draft).
P_MC = torch.softmax(torch.randn(V, V, generator=_gen) * 0.5, dim=-1)
Q_MC = torch.softmax(torch.randn(V, V, generator=_gen) * 1.0, dim=-1)
START = 0


def _draws(q: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    """n independent samples of each row of q [k, V] -> [n, k]; the draft's own
    randomness, independent of the verifier's streams."""
    gen = torch.Generator().manual_seed(seed)
    return torch.stack([torch.multinomial(row, n, replacement=True, generator=gen) for row in q], dim=1)


def _first_tokens(stochastic: bool) -> torch.Tensor:
    k = Q_ROWS.shape[0]
    drafts = _draws(Q_ROWS, N_TRIALS, seed=1)  # [N, k]
    logits = P_ROWS.log().repeat(N_TRIALS, 1)  # [N * (k+1), V]
    q = Q_ROWS if stochastic else None
    props = [DraftProposal(drafts[i].tolist(), q) for i in range(N_TRIALS)]
    out = verify_batch(logits, props, [T1] * N_TRIALS, [RequestRng(s) for s in range(N_TRIALS)], [0] * N_TRIALS)
    assert all(1 <= len(o) <= k + 1 for o in out)
    return torch.tensor([o[0] for o in out])


@pytest.mark.parametrize("stochastic", [True, False], ids=["stochastic", "deterministic"])
def test_sampled_verification_draws_the_first_token_from_the_target_distribution(stochastic: bool) -> None:
    first = _first_tokens(stochastic)
    assert chisquare_pvalue(torch.bincount(first, minlength=V), P_ROWS[0]) > 1e-3


def _broken_first_tokens(rule: str) -> torch.Tensor:
    """Deliberately wrong rules, with the same randomness as the real one."""
    drafts = _draws(Q_ROWS, N_TRIALS, seed=1)[:, 0]  # [N]
    rngs = [RequestRng(s) for s in range(N_TRIALS)]
    p, q = P_ROWS[0], Q_ROWS[0]
    if rule == "accept_always":
        return drafts
    u = torch.tensor([r.uniform(0, STREAM_ACCEPT) for r in rngs])  # [N]
    accept = u * q[drafts] < p[drafts]
    noise = exponential_noise([r.key(0, STREAM_RESIDUAL) for r in rngs], V)  # [N, V]
    if rule == "residual_from_p":
        residual = p.expand(N_TRIALS, -1)
    elif rule == "no_ratio":  # accept with probability p(d) instead of min(1, p/q)
        accept = u < p[drafts]
        residual = (p - q).clamp(min=0).expand(N_TRIALS, -1)
    else:
        raise ValueError(rule)
    return torch.where(accept, drafts, race(residual, noise))


@pytest.mark.parametrize("rule", ["accept_always", "residual_from_p", "no_ratio"])
def test_the_distribution_check_catches_broken_acceptance_rules(rule: str) -> None:
    first = _broken_first_tokens(rule)
    assert chisquare_pvalue(torch.bincount(first, minlength=V), P_ROWS[0]) < 1e-6


def _two_tokens(stochastic: bool, k: int = 3) -> torch.Tensor:
    """Generate two tokens per trial from the Markov target with speculation. -> [N, 2]."""
    rngs = [RequestRng(s) for s in range(N_TRIALS)]
    gen = torch.Generator().manual_seed(11)
    logp = P_MC.log()

    def step(lasts: list[int], position: int) -> list[list[int]]:
        n = len(lasts)
        drafts = torch.empty(n, k, dtype=torch.long)
        prev = torch.tensor(lasts)
        q_rows = torch.empty(n, k, V)
        for j in range(k):
            q_rows[:, j] = Q_MC[prev]
            prev = torch.multinomial(Q_MC[prev], 1, generator=gen).squeeze(1)
            drafts[:, j] = prev
        ctx = torch.cat([torch.tensor(lasts).unsqueeze(1), drafts], dim=1)  # [n, k+1]: the inputs
        logits = logp[ctx].reshape(n * (k + 1), V)  # row j predicts after input j
        props = [DraftProposal(drafts[i].tolist(), q_rows[i] if stochastic else None) for i in range(n)]
        return verify_batch(logits, props, [T1] * n, active_rngs, [position] * n)

    active_rngs = rngs
    first = step([START] * N_TRIALS, 0)
    out = torch.empty(N_TRIALS, 2, dtype=torch.long)
    need = []
    for i, emitted in enumerate(first):
        out[i, 0] = emitted[0]
        if len(emitted) >= 2:
            out[i, 1] = emitted[1]
        else:
            need.append(i)
    active_rngs = [rngs[i] for i in need]
    second = step([int(out[i, 0]) for i in need], 1)
    for i, emitted in zip(need, second):
        out[i, 1] = emitted[0]
    assert 0 < len(need) < N_TRIALS  # both paths to the second token were taken
    return out


@pytest.mark.parametrize("stochastic", [True, False], ids=["stochastic", "deterministic"])
def test_sampled_verification_draws_the_second_token_from_the_target_distribution(stochastic: bool) -> None:
    toks = _two_tokens(stochastic)
    joint_counts = torch.bincount(toks[:, 0] * V + toks[:, 1], minlength=V * V)
    joint_p = P_MC[START].unsqueeze(1) * P_MC  # [V, V]: p(t0) p(t1 | t0)
    assert chisquare_pvalue(joint_counts, joint_p) > 1e-3


# ---------------------------------------------------------------- reproducibility

VR = 32
_genr = torch.Generator().manual_seed(7)
T_LAST = torch.randn(VR, VR, generator=_genr) * 2.0
T_PREV = torch.randn(VR, VR, generator=_genr)


def toy_logits(ctx: list[int]) -> torch.Tensor:
    """A deterministic toy LM: logits [VR] of the next token given the context."""
    return T_LAST[ctx[-1]] + T_PREV[ctx[-2]]


def generate_plain(prompt: list[int], params: SamplingOptions, rng: RequestRng, n: int) -> list[int]:
    out: list[int] = []
    for t in range(n):
        out.append(sample_next(toy_logits(prompt + out), params, rng, t))
    return out


def generate_spec(
    prompt: list[int], params: SamplingOptions, rng: RequestRng, n: int, k_of_step, oracle: list[int], seed: int
) -> tuple[list[int], int, int]:
    """Speculative generation with a deterministic proposer: each draft is the
    oracle's token with probability 0.6, else a random one (so both acceptances
    and rejections happen). Returns (tokens, drafted, accepted)."""
    noisy = random.Random(seed)
    out: list[int] = []
    drafted = accepted = 0
    step = 0
    while len(out) < n:
        k = k_of_step(step)
        t = len(out)
        drafts = [
            oracle[t + j] if t + j < len(oracle) and noisy.random() < 0.6 else noisy.randrange(VR) for j in range(k)
        ]
        ctx = prompt + out
        logits = torch.stack([toy_logits(ctx + drafts[:j]) for j in range(k + 1)])  # [k+1, VR]
        emitted = verify(logits, DraftProposal(drafts), params, rng, t)
        drafted += k
        accepted += len(emitted) - 1
        out += emitted
        step += 1
    return out[:n], drafted, accepted


@pytest.mark.parametrize(
    "params",
    [GREEDY, SamplingOptions(temperature=0.8), SamplingOptions(temperature=1.3, top_k=12, top_p=0.9)],
    ids=["greedy", "t0.8", "t1.3-topk-topp"],
)
def test_same_seed_same_tokens_whatever_the_draft_lengths(params: SamplingOptions) -> None:
    prompt = [1, 2, 3]
    n = 60
    reference = generate_plain(prompt, params, RequestRng(1234), n)
    mix = random.Random(5)
    schedules = {
        "k0": lambda s: 0,
        "k2": lambda s: 2,
        "k5": lambda s: 5,
        "mixed": lambda s: mix.choice([0, 1, 2, 3, 5, 7]),
    }
    total_drafted = total_accepted = 0
    for name, sched in schedules.items():
        toks, drafted, accepted = generate_spec(prompt, params, RequestRng(1234), n, sched, reference, seed=len(name))
        assert toks == reference, name
        total_drafted += drafted
        total_accepted += accepted
    assert 0 < total_accepted < total_drafted  # both acceptances and rejections were exercised
    if not params.greedy:
        assert generate_plain(prompt, params, RequestRng(4321), n) != reference  # the seed matters
