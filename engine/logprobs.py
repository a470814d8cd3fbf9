"""Log-probabilities of the emitted tokens, as the target model gave them (vLLM's ``raw_logprobs`` mode).

Captured from a step's logits before any processor, grammar mask, temperature or filter touches them, so they
are ``log_softmax`` of the model's own output at that position, whether the token came from an accepted draft,
a correction, or plain sampling: row j of a decode is the target's distribution after the prefix plus the
drafts accepted before it, which is the position of the j-th emitted token.

Prompt logprobs (vLLM's ``prompt_logprobs``) come from the same raw logits at the prompt's positions during prefill:
row p is the distribution of prompt token p + 1 (the first prompt token has none).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class LogprobEntry:
    """One emitted token: its log-probability and the `top` most likely tokens at its position (id, logprob)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class RawLogprobs:
    """The raw log-softmax rows of the sequences that asked for logprobs, kept across processing."""

    rows: dict[int, tuple[Tensor, int]]  # sequence index -> ([k+1, V] float32 log-probs, how many top tokens)

    @classmethod
    @torch.inference_mode()
    def capture(cls, logits: Tensor, wanted: dict[int, tuple[int, int, int]]) -> RawLogprobs:
        """wanted: sequence index -> (first row, rows, top n); copies those rows' log_softmax before processing."""
        return cls({i: (logits[first : first + n].float().log_softmax(dim=-1), top)
                    for i, (first, n, top) in wanted.items()})

    def of(self, i: int, tokens: list[int]) -> list[LogprobEntry] | None:
        """The emitted tokens of sequence i (token j from row j) with their log-probs; None: it did not ask."""
        if i not in self.rows:
            return None
        rows, top = self.rows[i]
        return entries(rows, tokens, top)


def entries(rows: Tensor, tokens: list[int], top: int) -> list[LogprobEntry]:
    """Token j's log-prob from row j of `rows` ([>= len(tokens), V] log-probs), with the `top` best at that row."""
    picked = rows[torch.arange(len(tokens)), torch.tensor(tokens)].tolist()  # [m]
    best = rows[: len(tokens)].topk(top, dim=-1) if top else None
    out = []
    for j, (tok, lp) in enumerate(zip(tokens, picked)):
        alts = () if best is None else tuple(zip(best.indices[j].tolist(), best.values[j].tolist()))
        out.append(LogprobEntry(tok, lp, alts))
    return out


@torch.inference_mode()
def prompt_entries(logits: Tensor, next_tokens: list[int], top: int) -> list[LogprobEntry]:
    """Prompt logprobs of one prefill chunk: logits [n, V] of positions p..p+n-1 (raw, unprocessed) and the prompt
    tokens p+1..p+n they predict. Only this chunk's rows are ever held as float32 log-probs."""
    return entries(logits.float().log_softmax(dim=-1), next_tokens, top)
