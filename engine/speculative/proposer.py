"""The interface between the engine and a draft proposer.

Per step the engine asks each proposer for up to k_i draft tokens per decoding
sequence (k_i from the speculation controller), feeds [last_token, d_1..d_k]
to one batched target forward, verifies with `engine.speculative.verifier`, and then
tells the proposer how many tokens each sequence really has (`rollback`).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from torch import Tensor

from engine.request import SamplingOptions
from engine.sampler import RequestRng


@dataclass
class ProposalInput:
    """One sequence to draft for.

    token_ids: prompt + output so far, committed tokens only (never drafts);
    the last element is the most recent token. Between calls it only grows,
    except after `Proposer.rollback`.
    num_prompt_tokens: lets a proposer compute output positions
    (position of the first draft = len(token_ids) - num_prompt_tokens), which
    position-keyed drafting needs; rng: the request's randomness, for proposers
    that sample. Proposers that need neither ignore them.
    """

    seq_id: str
    token_ids: list[int]
    params: SamplingOptions
    num_prompt_tokens: int = 0
    rng: RequestRng | None = None
    scope: str = ""  # EngineRequest.draft_scope: whose past outputs may draft for it

    @property
    def next_position(self) -> int:
        """Output position of the first draft token."""
        return len(self.token_ids) - self.num_prompt_tokens


@dataclass
class DraftProposal:
    """Draft tokens for one sequence.

    probs [k, V_target]: row i is the draft distribution q_i that tokens[i] was
    sampled from (the verifier's rejection rule needs it). None means the
    proposal is deterministic given the prefix (n-gram lookup, greedy or
    coupled draft-model drafting): the verifier then uses the coupled rule,
    whose output equals non-speculative sampling token for token.
    """

    tokens: list[int]
    probs: Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)


EMPTY_PROPOSAL = DraftProposal(tokens=[], probs=None)


@runtime_checkable
class Proposer(Protocol):
    def propose(self, inputs: list[ProposalInput], num_tokens: list[int]) -> list[DraftProposal]:
        """Batched across sequences: at most num_tokens[i] drafts for inputs[i].

        May return fewer tokens than asked, even none (no n-gram match, or the
        draft would run past its context); never more.
        """
        ...

    def rollback(self, seq_id: str, num_tokens: int) -> None:
        """The sequence now has num_tokens committed tokens: drop draft state past that."""
        ...

    def release(self, seq_id: str) -> None:
        """The sequence is finished or aborted: free everything kept for it."""
        ...


@runtime_checkable
class HiddenStateConsumer(Protocol):
    """A proposer that drafts from the target's hidden states (EAGLE): the engine hands it,
    after each step, the hidden states of the rows that became committed tokens."""

    def observe_hidden(self, seq_id: str, first_position: int, hidden: Tensor) -> None:
        """hidden [n, hidden_size]: the target's final-normed states of positions first_position.. ."""
        ...


@runtime_checkable
class FollowsWeightFormat(Protocol):
    """A proposer with weights of its own (a draft head) that picks their format to suit the target's
    (engine.weights), told once the engine has put the target in it."""

    def follow_weight_format(self, fmt: str, kernel: str) -> None:
        """fmt: the resolved format ("fp32", "bf16", "int8", "int4"); kernel: engine.quant_kernel."""
        ...


@runtime_checkable
class DraftSources(Protocol):
    """A proposer made of sources that draft with different acceptance (prompt lookup where the text repeats
    itself, a draft head elsewhere): the controller keeps a speculation state per source, so a source that keeps
    missing does not shorten, or switch off, the drafts of one that hits."""

    def source(self, inp: ProposalInput, skip: frozenset[str] = frozenset()) -> str:
        """Which source drafts for this sequence in the next propose call (same committed tokens). skip: sources
        the controller has switched off for it (poor acceptance, no probe due): the next one that would draft
        takes the step, if any."""
        ...


@runtime_checkable
class LearnsFromOutputs(Protocol):
    """A proposer that drafts from what earlier requests generated (suffix decoding): the engine hands it each
    speculating request's generated tokens when the request finishes, before `release` (not those of a request
    that keeps its output out: EngineRequest.keep_output)."""

    def observe_finished(self, seq_id: str, output_ids: Sequence[int], scope: str = "") -> None:
        ...
