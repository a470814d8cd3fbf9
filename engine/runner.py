"""Turns a SchedulerOutput into one flat model forward and returns the needed logits."""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from engine.kv_cache import KVCache
from engine.model import AttentionMetadata, Decoder, FlatBatchBuilder
from engine.scheduler import SchedulerOutput


@dataclass
class RunnerOutput:
    # [num_rows, V] fp32: the rows of every sequence that needed logits, in
    # schedule order, consecutive per sequence (the layout verify_batch takes).
    logits: torch.Tensor
    # request id -> (first row, end row) in `logits`.
    rows: dict[str, tuple[int, int]]
    forward_s: float

    def for_request(self, request_id: str) -> torch.Tensor:
        start, end = self.rows[request_id]
        return self.logits[start:end]  # [rows, V]


@dataclass
class FlatBatch:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    attn: AttentionMetadata
    logit_rows: torch.Tensor  # [n] int64: rows of the batch whose hidden state goes to the LM head
    rows: dict[str, tuple[int, int]]


class ModelRunner:
    def __init__(self, model: Decoder, kv_cache: KVCache) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.device = model.device

    def prepare(self, batch: SchedulerOutput) -> FlatBatch:
        builder = FlatBatchBuilder(self.device)
        logit_rows: list[int] = []
        rows: dict[str, tuple[int, int]] = {}
        for sched in batch.scheduled:
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
            q_start = builder.add(tokens, start, seq.kv.region.start)
            if sched.needs_logits:
                first = len(logit_rows)
                if sched.is_prefill:
                    logit_rows.append(q_start + n - 1)
                else:
                    logit_rows.extend(range(q_start, q_start + n))
                rows[seq.request_id] = (first, len(logit_rows))

        input_ids, positions, attn = builder.build(self.kv_cache)
        return FlatBatch(
            input_ids=input_ids, positions=positions, attn=attn, logit_rows=builder.tensor(logit_rows), rows=rows
        )

    @torch.inference_mode()
    def execute(self, batch: SchedulerOutput) -> RunnerOutput:
        start = time.perf_counter()
        flat = self.prepare(batch)
        hidden = self.model(flat.input_ids, flat.positions, flat.attn)  # [T, hidden]
        logits = self.model.compute_logits(hidden[flat.logit_rows])  # [n, V]
        # The KV of every fed row is written; rejected drafts are rolled back by the engine.
        for sched in batch.scheduled:
            kv = sched.seq.kv
            if kv is not None:
                kv.num_cached += sched.num_new_tokens
        if logits.is_cuda:
            torch.cuda.synchronize(logits.device)
        return RunnerOutput(logits=logits, rows=flat.rows, forward_s=time.perf_counter() - start)
