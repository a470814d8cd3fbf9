"""The end of a step: emitted tokens through the finish checks into outputs, and what a leaving request gives back.

Finish checks per token, in order: EOS or one of the request's stop_token_ids (never detokenized), a stop string
the token completes, max_tokens; tokens after a finish are dropped. A request
that leaves (finished, aborted, expired, failed) frees its KV region at once
(the scheduler), its adapter and its proposer state; one that finishes first hands its output to a proposer
that learns from outputs (suffix decoding).
"""
from __future__ import annotations

from engine.detokenizer import IncrementalDetokenizer
from engine.logprobs import LogprobEntry
from engine.lora.requests import LoRARequests
from engine.outputs import FinishReason, RequestOutput, SpecCounters
from engine.scheduler import Scheduler
from engine.sequence import Sequence
from engine.speculative.proposer import LearnsFromOutputs, Proposer


def _detok(seq: Sequence) -> IncrementalDetokenizer:
    if seq.detok is None:  # set in add_request; only hand-built sequences lack it
        raise RuntimeError(f"{seq.request_id} has no detokenizer")
    return seq.detok


def final_output(seq: Sequence, tokens: list[int], text: str, spec: SpecCounters) -> RequestOutput:
    return RequestOutput(
        request_id=seq.request_id,
        token_ids=tokens,
        text=text,
        finished=True,
        finish_reason=seq.finish_reason,
        spec=spec,
        stats=seq.stats(),
    )


class Committer:
    def __init__(
        self,
        scheduler: Scheduler,
        eos_token_ids: frozenset[int],
        proposer: Proposer | None,
        lora: LoRARequests | None,
    ) -> None:
        self.scheduler = scheduler
        self.eos_token_ids = eos_token_ids
        self.proposer = proposer
        self.lora = lora

    def commit(self, seq: Sequence, tokens: list[int], step_spec: SpecCounters, now: float,
               logprobs: list[LogprobEntry] | None = None) -> RequestOutput:
        """Append the emitted tokens up to the first finish (EOS, stop string, max_tokens); logprobs: one per token.
        max_tokens 0 (a prompt scored, not continued: echo) finishes at the prompt, the sampled token dropped."""
        detok = _detok(seq)
        new: list[int] = []
        params = seq.params
        prompt_logprobs = seq.prompt_logprobs if params.prompt_logprobs is not None and not seq.output_ids else None
        reason: FinishReason | None = "length" if params.max_tokens == 0 else None
        for tok in tokens if reason is None else []:
            seq.output_ids.append(tok)
            new.append(tok)
            # EOS tokens are not text: they never reach the detokenizer.
            eos = (not params.ignore_eos and tok in self.eos_token_ids) or tok in params.stop_token_ids
            if eos or detok.add_token(tok):  # EOS, or a stop string completed
                reason = "stop"
            elif len(seq.output_ids) >= params.max_tokens:
                reason = "length"
            if reason is not None:
                break  # tokens after a finish are dropped
        kept = None if logprobs is None else logprobs[: len(new)]  # the tokens after a finish are dropped
        if reason is not None:
            self.scheduler.finish(seq, reason, now)
            if isinstance(self.proposer, LearnsFromOutputs) and seq.speculate and seq.request.keep_output:
                self.proposer.observe_finished(seq.request_id, seq.output_ids, seq.request.draft_scope)
            self.release(seq)
            out = final_output(seq, new, detok.take_delta(final=True), step_spec)
            out.logprobs, out.prompt_logprobs = kept, prompt_logprobs
            return out
        if self.proposer is not None and seq.speculate:
            self.proposer.rollback(seq.request_id, seq.num_tokens)
        return RequestOutput(seq.request_id, new, detok.take_delta(), spec=step_spec, logprobs=kept,
                             prompt_logprobs=prompt_logprobs)

    def release(self, seq: Sequence) -> None:
        """What the scheduler does not hold: the request's adapter and its proposer state."""
        if self.lora is not None:
            self.lora.release(seq)
        if self.proposer is not None and seq.speculate:
            self.proposer.release(seq.request_id)

    def expired(self, seq: Sequence) -> RequestOutput:
        """The final output of a request the scheduler dropped at its deadline."""
        self.release(seq)
        return final_output(seq, [], _detok(seq).take_delta(final=True), SpecCounters())
