"""Turning the target's logits over [last_token, d_1..d_k] into accepted tokens.

Row i of a sequence's logits is the target's distribution for output position
`position + i`, given the prefix plus d_1..d_i. Every sequence gets back its
accepted drafts plus exactly one token of the target's own (the correction at
the first rejection, or a bonus token when all k drafts were accepted), so
1..k+1 tokens per step.

Three rules, each lossless with respect to `target_probs` (the distribution
plain sampling uses):

greedy (temperature 0)
    accept while d_i == argmax p_i; then emit the target's argmax.

deterministic proposal (probs None: n-gram, greedy or coupled drafts)
    q_i is a point mass on d_i, and Leviathan's rule reduces to "accept d with
    probability p(d), else sample from p with d removed". We implement it
    coupled to plain sampling: y_i = the position-keyed sample of p_i (what
    `sample_next` would return at that position); accept iff y_i == d_i, else
    emit y_i and stop. P(accept) = p(d) and, given rejection, y_i is p
    conditioned on != d: exactly Leviathan's rule in distribution. The emitted
    tokens are always the y_i, so the text is identical to non-speculative
    seeded sampling, whatever drafts or draft lengths were used.

stochastic proposal (probs given: d_i ~ q_i)
    Leviathan et al. 2023 / Chen et al. 2023: accept d_i with probability
    min(1, p_i(d_i) / q_i(d_i)); on rejection emit a sample of
    normalise(max(p_i - q_i, 0)); after k acceptances emit a bonus sample of
    p_k. Lossless in distribution, but which randomness is consumed depends on
    the draft length, so the text is reproducible only for a fixed sequence of
    draft lengths (see draft_model.py's `draft_sampling`).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from engine.request import SamplingOptions
from engine.sampler import (
    STREAM_ACCEPT,
    STREAM_RESIDUAL,
    STREAM_SAMPLE,
    NoiseKey,
    RequestRng,
    exponential_noise,
    race,
    target_probs,
    uniforms,
)
from engine.speculative.proposer import DraftProposal


@dataclass
class _Layout:
    """Where each sequence's rows sit in the flat logits: k_i + 1 consecutive rows from starts[i]."""

    ks: list[int]
    starts: list[int]

    def rows(self, i: int) -> range:
        return range(self.starts[i], self.starts[i] + self.ks[i] + 1)


@dataclass
class _Sampled:
    """The sampled (temperature > 0) sequences of a batch and their target distributions."""

    seqs: list[int]  # indexes into the batch
    rngs: dict[int, RequestRng]
    local: dict[int, int]  # seq -> its first row in `probs`
    probs: Tensor  # [S, V]: every row of every sampled sequence, in order


@dataclass
class _Rejections:
    """Phase A's result for the stochastic proposals (draft probs given)."""

    first_reject: dict[int, int]  # seq -> index of its first rejected draft; k if none
    q_offset: dict[int, int]  # seq -> its first row in q_all
    q_all: Tensor  # [sum k, V]: the draft distributions, concatenated


def verify_batch(
    logits: Tensor,
    proposals: Sequence[DraftProposal],
    params: Sequence[SamplingOptions],
    rngs: Sequence[RequestRng | None],
    positions: Sequence[int],
) -> list[list[int]]:
    """Verify the drafts of several sequences at once.

    logits [sum_i (k_i + 1), V]: the rows of sequence i are consecutive, k_i + 1
    of them, in the order of `proposals` (the flat layout of one batched target
    forward). positions[i] is the output position of sequence i's first
    emitted token. Returns per sequence its emitted tokens (1..k_i + 1).
    Costs at most two host syncs, whatever the batch size.
    """
    layout = _layout(logits, proposals, params, rngs, positions)
    n = len(proposals)
    results: list[list[int]] = [[] for _ in range(n)]

    # Greedy sequences: argmax of every row, one reduction for the whole batch.
    greedy = [i for i in range(n) if params[i].greedy]
    if greedy:
        argmax = logits.argmax(dim=-1).tolist()  # [rows]
        for i in greedy:
            results[i] = _accept_greedy(proposals[i].tokens, [argmax[r] for r in layout.rows(i)])
    sampled_seqs = [i for i in range(n) if not params[i].greedy]
    if not sampled_seqs:
        return results

    sampled = _target_rows(logits, layout, params, rngs, sampled_seqs)
    rejections = _accept_tests(sampled, layout, proposals, positions)
    picks = _races(sampled, layout, rejections, positions)

    cursor = 0
    for i in sampled.seqs:
        drafts = proposals[i].tokens
        if i in rejections.first_reject:
            results[i] = list(drafts[: rejections.first_reject[i]]) + [picks[cursor]]
            cursor += 1
        else:
            results[i] = _accept_coupled(drafts, picks[cursor : cursor + layout.ks[i] + 1])
            cursor += layout.ks[i] + 1
    return results


def _layout(
    logits: Tensor,
    proposals: Sequence[DraftProposal],
    params: Sequence[SamplingOptions],
    rngs: Sequence[RequestRng | None],
    positions: Sequence[int],
) -> _Layout:
    """Check that the arguments describe one flat batch and find each sequence's rows."""
    n = len(proposals)
    if not (len(params) == len(rngs) == len(positions) == n):
        raise ValueError("verify_batch needs one params, rng and position per proposal")
    if logits.dim() != 2:
        raise ValueError(f"logits must be [rows, V], got shape {tuple(logits.shape)}")
    ks = [len(p.tokens) for p in proposals]
    starts: list[int] = []
    total = 0
    for k in ks:
        starts.append(total)
        total += k + 1
    if total != logits.shape[0]:
        raise ValueError(f"logits has {logits.shape[0]} rows but the proposals need {total} (sum of k_i + 1)")
    return _Layout(ks, starts)


def _target_rows(
    logits: Tensor,
    layout: _Layout,
    params: Sequence[SamplingOptions],
    rngs: Sequence[RequestRng | None],
    seqs: list[int],
) -> _Sampled:
    """Target distributions of every row of every sampled sequence, in order."""
    rng_of: dict[int, RequestRng] = {}
    for i in seqs:
        rng = rngs[i]
        if rng is None:
            raise ValueError(f"sequence {i} samples (temperature {params[i].temperature}) but has no RequestRng")
        rng_of[i] = rng
    local: dict[int, int] = {}
    rows: list[int] = []
    row_params: list[SamplingOptions] = []
    for i in seqs:
        local[i] = len(rows)
        rows.extend(layout.rows(i))
        row_params.extend([params[i]] * (layout.ks[i] + 1))
    picked = logits if len(rows) == logits.shape[0] else logits[torch.tensor(rows, device=logits.device)]
    return _Sampled(seqs, rng_of, local, target_probs(picked, row_params))  # probs [S, V]


def _accept_tests(
    sampled: _Sampled, layout: _Layout, proposals: Sequence[DraftProposal], positions: Sequence[int]
) -> _Rejections:
    """Phase A (stochastic proposals only): accept d_j iff u_j * q_j(d_j) < p_j(d_j),
    i.e. with probability min(1, p/q), written without the division."""
    probs, ks = sampled.probs, layout.ks
    device, vocab = probs.device, probs.shape[1]
    stochastic = [i for i in sampled.seqs if proposals[i].probs is not None and ks[i] > 0]
    out = _Rejections({}, {}, torch.empty(0, vocab, device=device))
    if not stochastic:
        return out
    q_list: list[Tensor] = []
    p_rows: list[int] = []
    d_cols: list[int] = []
    accept_keys: list[NoiseKey] = []
    for i in stochastic:
        q = proposals[i].probs
        if q is None or q.dim() != 2 or q.shape[0] < ks[i] or q.shape[1] != vocab:
            shape = None if q is None else tuple(q.shape)
            raise ValueError(f"draft probs of sequence {i} have shape {shape}, expected [{ks[i]}, {vocab}]")
        out.q_offset[i] = len(d_cols)
        q_list.append(q[: ks[i]])
        p_rows.extend(range(sampled.local[i], sampled.local[i] + ks[i]))
        d_cols.extend(proposals[i].tokens)
        accept_keys.extend(sampled.rngs[i].key(positions[i] + j, STREAM_ACCEPT) for j in range(ks[i]))
    out.q_all = torch.cat(q_list).to(device=device, dtype=torch.float32)  # [sum k, V]
    d_t = torch.tensor(d_cols, device=device).unsqueeze(1)  # [sum k, 1]
    p_d = probs[torch.tensor(p_rows, device=device)].gather(1, d_t).squeeze(1)  # [sum k]
    q_d = out.q_all.gather(1, d_t).squeeze(1)  # [sum k]
    accepted = (uniforms(accept_keys, device) * q_d < p_d).tolist()  # [sum k]
    for i in stochastic:
        off, j = out.q_offset[i], 0
        while j < ks[i] and accepted[off + j]:
            j += 1
        out.first_reject[i] = j
    return out


def _races(sampled: _Sampled, layout: _Layout, rejections: _Rejections, positions: Sequence[int]) -> list[int]:
    """Phase B: every exponential race still needed, as one batched race, in the
    order of sampled.seqs: one token per stochastic proposal (the residual sample
    after its first rejection, or the bonus from p_k), k + 1 per deterministic one."""
    probs, ks = sampled.probs, layout.ks
    device = probs.device
    race_rows: list[int] = []  # rows of `probs`
    race_keys: list[NoiseKey] = []
    residual_at: list[int] = []  # entries of race_rows whose weights are max(p - q, 0)
    residual_q: list[int] = []  # ...and the row of q_all to subtract
    for i in sampled.seqs:
        rng, local = sampled.rngs[i], sampled.local[i]
        if i in rejections.first_reject:
            j = rejections.first_reject[i]
            if j < ks[i]:
                residual_at.append(len(race_rows))
                residual_q.append(rejections.q_offset[i] + j)
                race_keys.append(rng.key(positions[i] + j, STREAM_RESIDUAL))
            else:
                race_keys.append(rng.key(positions[i] + j, STREAM_SAMPLE))  # bonus token from p_k
            race_rows.append(local + j)
        else:
            # Deterministic proposal: the plain position-keyed sample of every row.
            race_rows.extend(range(local, local + ks[i] + 1))
            race_keys.extend(rng.key(positions[i] + j, STREAM_SAMPLE) for j in range(ks[i] + 1))

    weights = probs if len(race_rows) == probs.shape[0] else probs[torch.tensor(race_rows, device=device)]  # [R, V]
    if residual_at:
        idx = torch.tensor(residual_at, device=device)
        q_rows = rejections.q_all[torch.tensor(residual_q, device=device)]  # [r, V]: q at each rejected position
        p_rows_t = weights[idx]  # [r, V]
        residual = (p_rows_t - q_rows).clamp_(min=0.0)  # [r, V]
        # Degenerate residual (p <= q everywhere, reachable only through
        # rounding since a rejection needs p(d) < q(d)): sample from p instead.
        empty = residual.sum(dim=-1, keepdim=True) <= 0.0  # [r, 1]
        weights = weights.index_copy(0, idx, torch.where(empty, p_rows_t, residual))
    return race(weights, exponential_noise(race_keys, probs.shape[1], device)).tolist()  # [R]


def _accept_greedy(drafts: Sequence[int], argmax: Sequence[int]) -> list[int]:
    """argmax [k+1]: accept while the draft is the target's argmax, then its argmax."""
    out: list[int] = []
    for d, a in zip(drafts, argmax):
        if d != a:
            break
        out.append(d)
    out.append(argmax[len(out)])
    return out


def _accept_coupled(drafts: Sequence[int], ys: Sequence[int]) -> list[int]:
    """ys [k+1]: the plain samples; emit them up to and including the first y != draft."""
    # Same comparison as the greedy rule, with samples in place of argmaxes.
    return _accept_greedy(drafts, ys)


def verify(
    logits: Tensor,
    proposal: DraftProposal,
    params: SamplingOptions,
    rng: RequestRng | None,
    position: int,
) -> list[int]:
    """Verify one sequence. logits [k+1, V]; returns accepted drafts + one target token.

    position: output position of the first token produced.
    """
    return verify_batch(logits, [proposal], [params], [rng], [position])[0]
