"""Speculative decoding: proposers, the lossless verifier and the adaptive controller.

    proposer.py    the Proposer protocol, ProposalInput, DraftProposal
    ngram.py       NgramProposer: model-free prompt lookup
    suffix.py      SuffixProposer: suffix decoding over the request's own text and past outputs (suffix_index.py)
    combined.py    LookupThenEagle: suffix decoding, prompt lookup and a draft head, one source per sequence
    draft_model.py DraftModelProposer: a small model sharing the target's tokenizer
    verifier.py    verify / verify_batch: logits [k+1, V] -> accepted tokens
    controller.py  SpeculationController: per-request and global draft lengths
    config.py      SpeculationTuning (the knobs only code sets; the settings are engine.config.SpeculationConfig)
"""
from engine.speculative.config import SpeculationTuning
from engine.speculative.controller import SpecState, SpeculationController
from engine.speculative.ngram import NgramProposer
from engine.speculative.proposer import DraftProposal, ProposalInput, Proposer
from engine.speculative.verifier import verify, verify_batch

__all__ = [
    "DraftProposal",
    "NgramProposer",
    "ProposalInput",
    "Proposer",
    "SpecState",
    "SpeculationController",
    "SpeculationTuning",
    "verify",
    "verify_batch",
]
