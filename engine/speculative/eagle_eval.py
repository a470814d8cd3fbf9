"""Acceptance of a draft head by draft position, measured the way serving drafts.

For each start in a held-out sequence's completion, the real EagleProposer is
given the target's features of the prefix (as the engine would after a step)
and drafts k tokens; draft i counts as accepted when drafts 1..i all equal the
target's greedy continuation. That continuation is known from the recorded
labels only while the recorded tokens follow it (greedy data always does;
sampled data only in stretches), so a start contributes the positions where
it is known.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.model import Decoder
from engine.request import SamplingOptions
from engine.speculative.eagle import EagleProposer
from engine.speculative.eagle_head import EagleHead
from engine.speculative.eagle_train import Progress, TrainExample, bar
from engine.speculative.proposer import ProposalInput


@dataclass
class Acceptance:
    tested: list[int]  # [k]: starts where draft i was tested (drafts before it accepted, continuation known)
    accepted: list[int]  # [k]

    def by_position(self) -> list[float]:
        """[k]: P(draft i accepted | drafts 1..i-1 accepted)."""
        return [a / t if t else 0.0 for a, t in zip(self.accepted, self.tested)]

    def expected_tokens(self) -> float:
        """Tokens per target step with k drafts always: 1 + sum_i P(drafts 1..i accepted)."""
        total, alive = 1.0, 1.0
        for p in self.by_position():
            alive *= p
            total += alive
        return total


@torch.inference_mode()
def acceptance_by_position(
    head: EagleHead, target: Decoder, examples: list[TrainExample], k: int, progress: Progress, stride: int = 1
) -> Acceptance:
    """Every `stride`-th start of every example's completion, k drafts each."""
    acc = Acceptance([0] * k, [0] * k)
    for n_done, ex in enumerate(examples, start=1):
        length = len(ex.tokens)
        proposer = EagleProposer(head, target, kv_cache_tokens=length + k + 2, max_draft_tokens=k)
        tokens = ex.tokens.tolist()
        labels = ex.labels.tolist()
        # follows[j]: the recorded token after position j is the target's greedy choice.
        follows = [tokens[j + 1] == labels[j] for j in range(length - 1)]
        params = SamplingOptions(max_tokens=length - ex.num_prompt_tokens)
        fed = 0
        for t in range(max(ex.num_prompt_tokens, 1), length - 1, stride):
            # Committed: x_0..x_t; the engine has shown the features of positions 0..t-1.
            proposer.observe_hidden("s", fed, ex.features[fed:t].to(target.dtype))
            fed = t
            inp = ProposalInput("s", tokens[: t + 1], params, num_prompt_tokens=ex.num_prompt_tokens)
            drafts = proposer.propose([inp], [k])[0].tokens
            for i, d in enumerate(drafts):
                j = t + i  # the target's choice after position j is labels[j], known if the chain so far is recorded
                if j >= length or any(not follows[m] for m in range(t, j)):
                    break
                acc.tested[i] += 1
                if d != labels[j]:
                    break
                acc.accepted[i] += 1
        proposer.release("s")
        progress(f"held-out acceptance {bar(n_done, len(examples))}")
    return acc
