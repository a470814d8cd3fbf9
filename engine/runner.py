"""Turns a SchedulerOutput into one flat model forward and returns the needed logits.

The flat batch: every scheduled sequence's rows one after another (prefill
chunks and decodes mixed), so the linear layers run as single [T, hidden]
matmuls; FlatBatchBuilder lays it out, for this runner and for the draft
model's own forwards. The runner reads each sequence's KV counter to know
where its rows go and never moves it: the scheduler does, once verification
has said which rows stay (Scheduler.update_from_step).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from engine.kv_cache import KVCache
from engine.model import AttentionMetadata, Decoder, SeqAttention, causal_mask_at_end
from engine.scheduler import SchedulerOutput
from engine.sequence import Sequence


@dataclass
class FlatBatchBuilder:
    """Lays sequences one after another into the flat varlen batch `Decoder.forward` takes.

    Each sequence contributes the tokens it feeds this step, written to its KV
    region right after the `num_cached` positions it already holds.
    """

    device: torch.device | str
    input_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    seqs: list[SeqAttention] = field(default_factory=list)

    def add(self, tokens: list[int], num_cached: int, region_start: int, prompt: bool = False) -> int:
        """Append one sequence; returns the batch row of its first token. prompt: the tokens are a prompt chunk
        (SeqAttention.prompt), not a decode's token and its drafts."""
        q_start, n = len(self.input_ids), len(tokens)
        self.input_ids.extend(tokens)
        self.positions.extend(range(num_cached, num_cached + n))
        self.slots.extend(range(region_start + num_cached, region_start + num_cached + n))
        kv_len = num_cached + n
        # A first prefill chunk is the whole sequence so far: SDPA's is_causal, no mask to build.
        mask = causal_mask_at_end(n, kv_len, self.device) if n > 1 and num_cached > 0 else None
        self.seqs.append(SeqAttention(q_start, n, region_start, kv_len, mask, prompt))
        return q_start

    def tensor(self, xs: list[int]) -> torch.Tensor:
        return torch.tensor(xs, dtype=torch.long).to(self.device, non_blocking=True)

    def build(self, kv_cache: KVCache) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """(input_ids [T], positions [T], attention metadata) for `Decoder.forward`."""
        attn = AttentionMetadata(seqs=self.seqs, slot_mapping=self.tensor(self.slots), kv_cache=kv_cache)
        return self.tensor(self.input_ids), self.tensor(self.positions), attn


@dataclass
class FlatBatch:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    attn: AttentionMetadata
    # [n] int64: rows of the batch whose hidden state goes to the LM head, in
    # schedule order: a completing prefill chunk's last row, every row of a decode.
    logit_rows: torch.Tensor
    # Prefill chunks of sequences asking for prompt logprobs: (index in the schedule, first flat row, first prompt
    # position, rows): the positions whose next prompt token has no logprob recorded yet.
    prompt_rows: list[tuple[int, int, int, int]] = field(default_factory=list)


@dataclass
class RunnerOutput:
    # [num_rows, V] fp32: the rows of every sequence that needed logits, in
    # schedule order, consecutive per sequence (the layout verify_batch takes).
    logits: torch.Tensor
    forward_s: float
    # [T, hidden]: the final-normed hidden state of every fed row, in flat batch
    # order (a draft head reads the accepted ones); None unless the runner keeps them.
    hidden: torch.Tensor | None = None
    # [n_scheduled]: the first flat row of each scheduled sequence, in schedule order (with hidden).
    row_starts: list[int] = field(default_factory=list)
    # Index in the schedule -> (first prompt position p, [n, V] raw fp32 logits of positions p..p+n-1): the prompt
    # rows of the sequences asking for prompt logprobs (FlatBatch.prompt_rows).
    prompt_logits: dict[int, tuple[int, torch.Tensor]] = field(default_factory=dict)


def prompt_rows(seq: Sequence, start: int, n: int) -> tuple[int, int] | None:
    """(first position, count) of a prefill chunk over positions [start, start + n) whose logits give prompt logprobs
    not yet recorded (position p predicts prompt token p + 1); None: none of them (or the sequence did not ask)."""
    if not seq.wants_prompt_rows:
        return None
    lo, hi = len(seq.prompt_logprobs), min(start + n, seq.num_prompt_tokens - 1)
    if lo < start:  # the prefill starts past what is recorded: the prefix cache must not have served it
        raise RuntimeError(f"{seq.request_id}: prompt logprobs recorded to {lo}, prefill starts at {start}")
    return (lo, hi - lo) if hi > lo else None


class ModelRunner:
    def __init__(self, model: Decoder, kv_cache: KVCache, keep_hidden: bool = False) -> None:
        """keep_hidden: return every row's hidden state (an EAGLE proposer needs them; no copy is made here)."""
        self.model = model
        self.kv_cache = kv_cache
        self.device = model.device
        self.keep_hidden = keep_hidden

    def prepare(self, batch: SchedulerOutput) -> FlatBatch:
        builder = FlatBatchBuilder(self.device)
        logit_rows: list[int] = []
        prompt: list[tuple[int, int, int, int]] = []
        for i, sched in enumerate(batch.scheduled):
            seq = sched.seq
            if seq.kv is None:
                raise RuntimeError(f"{seq.request_id} is scheduled without a KV region")
            start = seq.num_computed
            n = sched.num_new_tokens
            if sched.is_prefill:
                tokens = seq.token_ids(start, start + n)
            else:
                # A decode feeds the last sampled token (whose KV is not cached yet) and its drafts.
                if start != seq.num_tokens - 1:
                    raise RuntimeError(f"{seq.request_id}: decode expects {seq.num_tokens - 1} cached tokens, has {start}")
                tokens = [seq.last_token, *sched.draft_tokens]
            if len(tokens) != n or start + n > seq.kv.region.size:
                raise RuntimeError(f"{seq.request_id}: {len(tokens)} tokens scheduled as {n}, or past its KV region")
            q_start = builder.add(tokens, start, seq.kv.region.start, prompt=sched.is_prefill)
            if sched.needs_logits:
                logit_rows.extend([q_start + n - 1] if sched.is_prefill else range(q_start, q_start + n))
            wanted = prompt_rows(seq, start, n) if sched.is_prefill else None
            if wanted is not None:
                prompt.append((i, q_start + wanted[0] - start, *wanted))

        input_ids, positions, attn = builder.build(self.kv_cache)
        return FlatBatch(input_ids=input_ids, positions=positions, attn=attn, logit_rows=builder.tensor(logit_rows),
                         prompt_rows=prompt)

    @torch.inference_mode()
    def execute(self, batch: SchedulerOutput) -> RunnerOutput:
        """One forward; the KV of every fed row is written (drafts included)."""
        start = time.perf_counter()
        flat = self.prepare(batch)
        hidden = self.model(flat.input_ids, flat.positions, flat.attn)  # [T, hidden]
        logits = self.model.compute_logits(hidden[flat.logit_rows])  # [n, V]
        # Only for the requests that asked: [rows, V] fp32 of one chunk each.
        prompt = {i: (pos, self.model.compute_logits(hidden[row : row + count]))
                  for i, row, pos, count in flat.prompt_rows}
        if logits.is_cuda:
            torch.cuda.synchronize(logits.device)
        if not self.keep_hidden:
            return RunnerOutput(logits=logits, forward_s=time.perf_counter() - start, prompt_logits=prompt)
        starts = [s.q_start for s in flat.attn.seqs]
        return RunnerOutput(logits=logits, forward_s=time.perf_counter() - start, hidden=hidden, row_starts=starts,
                            prompt_logits=prompt)
