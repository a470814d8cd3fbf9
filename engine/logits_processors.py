"""A request's logits processors: logit bias, min_tokens, repetition / frequency / presence penalties.

Applied in place to a step's flat logits before verification, so plain decoding (k = 0) and speculative
verification see exactly the same processed rows. Row j of a decode with drafts d_1..d_k is the target's
distribution after the prefix plus d_1..d_j; it is only used when d_1..d_j were all accepted, so its
penalties count d_1..d_j as generated tokens: exactly what plain decoding would have counted at that position.

Order (vLLM's): logit bias, min_tokens, repetition penalty, then frequency and presence penalties; temperature,
min_p, top-k and top-p follow in engine.sampler.target_probs.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from engine.request import SamplingOptions


@dataclass(frozen=True)
class SequenceRows:
    """One sequence's consecutive rows in a step's logits and what plain decoding knows at each of them."""

    params: SamplingOptions
    prompt_ids: Sequence[int]
    output_ids: Sequence[int]  # generated before this step
    drafts: Sequence[int]  # row j follows drafts[:j]
    first_row: int


def out_of_vocabulary(params: SamplingOptions, vocab_size: int) -> str | None:
    """Why a token id of logit_bias or stop_token_ids cannot be honoured with this vocabulary; None: all fit."""
    for field, ids in (("logit_bias", [t for t, _ in params.logit_bias]), ("stop_token_ids", params.stop_token_ids)):
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            return f"{field}: token id {bad[0]} is outside the vocabulary (0..{vocab_size - 1})"
    return None


@torch.inference_mode()  # the runner's logits are inference tensors
def process_(logits: Tensor, seqs: Sequence[SequenceRows], stop_ids: frozenset[int]) -> None:
    """Apply every sequence's processors to its rows of logits [rows, V], in place.

    stop_ids: the engine's EOS tokens (masked by min_tokens unless the request ignores EOS)."""
    for s in seqs:
        if s.params.processes_logits:
            rows = logits[s.first_row : s.first_row + len(s.drafts) + 1]  # [k+1, V], a view
            _process_rows_(rows, s, stop_ids)


def _process_rows_(x: Tensor, s: SequenceRows, stop_ids: frozenset[int]) -> None:
    p, n_rows, vocab = s.params, x.shape[0], x.shape[1]
    device = x.device
    if p.logit_bias:
        ids = torch.tensor([t for t, _ in p.logit_bias], device=device)
        bias = torch.tensor([b for _, b in p.logit_bias], device=device, dtype=x.dtype)
        x[:, ids] += bias
    if p.min_tokens:
        stops = set(p.stop_token_ids) | (set() if p.ignore_eos else set(stop_ids))
        early = [j for j in range(n_rows) if len(s.output_ids) + j < p.min_tokens]
        if stops and early:
            x[torch.tensor(early, device=device).unsqueeze(1), torch.tensor(sorted(stops), device=device)] = -torch.inf
    if p.repetition_penalty == 1.0 and not p.frequency_penalty and not p.presence_penalty:
        return
    counts = _generated_counts(s, n_rows, vocab, device)  # [k+1, V]
    if p.repetition_penalty != 1.0:
        seen = counts > 0
        seen[:, torch.tensor(list(s.prompt_ids), device=device, dtype=torch.long)] = True
        penalised = torch.where(x > 0, x / p.repetition_penalty, x * p.repetition_penalty)
        x.copy_(torch.where(seen, penalised, x))
    if p.frequency_penalty or p.presence_penalty:
        x -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(x.dtype)


def _generated_counts(s: SequenceRows, n_rows: int, vocab: int, device: torch.device) -> Tensor:
    """[k+1, V] float32: row j counts the generated tokens plus drafts[:j]."""
    out = torch.tensor(list(s.output_ids), dtype=torch.long, device=device)
    base = torch.bincount(out, minlength=vocab).to(torch.float32)[:vocab]  # [V]
    counts = base.unsqueeze(0).repeat(n_rows, 1)  # [k+1, V]
    for j, d in enumerate(s.drafts[: n_rows - 1]):
        counts[j + 1 :, d] += 1.0
    return counts
