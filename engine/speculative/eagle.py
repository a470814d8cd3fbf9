"""EagleProposer: chain drafts from the EAGLE head (eagle_head.py) over the target's hidden states.

The target's final-normed hidden state f_j of every committed token reaches the
proposer after each step (`observe_hidden`, from the runner). The head keeps its
own one-layer KV in a small arena; position j of it holds the pair
(f_j, x_{j+1}). With n committed tokens x_0..x_{n-1}, `propose`:

1. catch up: feed the pairs not in the head's KV yet, j = fed..n-2, every
   sequence in one flat forward; the output of the last pair, g_{n-2}, is the
   head's guess of f_{n-1} and its LM-head argmax the first draft d_1;
2. draft: feed (g, d_i) at position n-2+i, one flat forward per draft position
   for the sequences still drafting, until each has its k drafts;
3. roll the head's KV back to the n-1 committed pairs: draft pairs are guesses.

Drafts are the argmax over the draft vocabulary for every request, so a
proposal is deterministic given the prefix (probs None): the verifier's greedy
and coupled rules keep the output token for token what plain decoding gives,
for greedy and seeded sampling alike, whatever draft lengths the controller picks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from engine.config import SpeculationConfig
from engine.kv_cache import CacheSlot, KVCache, kv_budget_bytes, region_size
from engine.model import Decoder
from engine.runner import FlatBatchBuilder
from engine.speculative.config import SpeculationTuning
from engine.speculative.eagle_head import EagleHead
from engine.speculative.proposer import EMPTY_PROPOSAL, DraftProposal, ProposalInput

if TYPE_CHECKING:
    from engine.loader import LoadedModel


@dataclass
class _HeadSeq:
    # The head's KV region, allocated at the first draft; slot.num_cached == fed between calls.
    slot: CacheSlot | None = None
    fed: int = 0  # pairs (f_j, x_{j+1}) in the head's KV: j = 0..fed-1
    # Target features not fed to the head yet, in position order from position `fed`.
    pending: list[Tensor] = field(default_factory=list)  # each [n_i, hidden]
    pending_rows: int = 0


class EagleProposer:
    def __init__(self, head: EagleHead, target: Decoder, kv_cache_tokens: int, max_draft_tokens: int) -> None:
        """head: loaded and bound to `target`, whose embedding and RoPE tables it uses."""
        self.head = head
        self.target = target
        self.max_draft_tokens = max_draft_tokens
        c = head.cfg
        self.kv_cache = KVCache(1, c.num_kv_heads, c.head_dim, kv_cache_tokens, target.dtype, target.device)
        self.device = target.device
        self._seqs: dict[str, _HeadSeq] = {}

    @classmethod
    def from_engine(
        cls,
        cfg: SpeculationConfig,
        target: LoadedModel,
        max_model_len: int,
        max_running_requests: int,
        tuning: SpeculationTuning | None = None,
    ) -> EagleProposer:
        """Load cfg.draft_head for the loaded target (before engine.weights quantizes it)."""
        from engine.kv_cache import kv_bytes_per_token
        from engine.speculative.eagle_artifact import load_head

        if not cfg.draft_head:
            raise ValueError("speculation method eagle needs draft_head (a head folder or name)")
        head, _meta = load_head(cfg.draft_head, target.model, target.name)
        c = head.cfg
        per_token = kv_bytes_per_token(1, c.num_kv_heads, c.head_dim, target.dtype)
        arena = tuning or SpeculationTuning()
        budget = kv_budget_bytes(target.device, arena.draft_kv_cache_bytes, arena.draft_kv_cache_fraction)
        tokens = min(budget // per_token, max_running_requests * region_size(max_model_len, cfg.max_draft_tokens))
        if tokens <= 0:
            raise ValueError(f"the draft head's KV budget of {budget} bytes holds no token")
        return cls(head, target.model, int(tokens), cfg.max_draft_tokens)

    def follow_weight_format(self, fmt: str, kernel: str) -> None:
        self.head.follow_weight_format(fmt, kernel)

    # ------------------------------------------------------------ hidden states

    def observe_hidden(self, seq_id: str, first_position: int, hidden: Tensor) -> None:
        """hidden [n, hidden]: the target's features of committed positions first_position.. (runner rows)."""
        st = self._seqs.setdefault(seq_id, _HeadSeq())
        if first_position != st.fed + st.pending_rows:
            return  # a gap or a repeat (never expected from the engine): keep what is consistent
        # A copy: a view would keep the step's whole [T, hidden] batch alive while the
        # controller has speculation off for this sequence (up to hundreds of steps).
        st.pending.append(hidden.clone())
        st.pending_rows += hidden.shape[0]

    # ------------------------------------------------------------ Proposer API

    @torch.inference_mode()
    def propose(self, inputs: list[ProposalInput], num_tokens: list[int]) -> list[DraftProposal]:
        if len(inputs) != len(num_tokens):
            raise ValueError(f"got {len(inputs)} inputs but {len(num_tokens)} draft lengths")
        out: list[DraftProposal] = [EMPTY_PROPOSAL] * len(inputs)
        # Draft pairs sit at positions up to n + k - 3: within the RoPE tables.
        ks = {i: min(k, self.target.max_positions - len(inp.token_ids)) for i, (inp, k) in enumerate(zip(inputs, num_tokens))}
        active = [i for i, inp in enumerate(inputs) if ks[i] > 0 and self._ready(inp, ks[i])]
        if not active:
            return out

        # 1. Catch up on the committed pairs; the last row of each sequence drafts d_1.
        feeds: list[tuple[_HeadSeq, list[int], Tensor]] = []
        for i in active:
            st, tokens = self._seqs[inputs[i].seq_id], inputs[i].token_ids
            start = st.fed
            feats = torch.cat(st.pending) if len(st.pending) > 1 else st.pending[0]  # [rows, hidden]
            rows = len(tokens) - 1 - start  # pairs start..n-2
            feeds.append((st, tokens[start + 1 :], feats[:rows]))
            st.pending, st.pending_rows = ([feats[rows:]], st.pending_rows - rows) if rows < feats.shape[0] else ([], 0)
        g = self._forward(feeds)  # [n_active, hidden]
        for st, toks, _ in feeds:
            st.fed += len(toks)

        # 2. Chain drafting, batched over the sequences still drafting.
        drafts: dict[int, list[int]] = {i: [] for i in active}
        running = active
        while True:
            for i, tok in zip(running, self.head.draft_ids(g).tolist()):
                drafts[i].append(tok)
            keep = [r for r, i in enumerate(running) if len(drafts[i]) < ks[i]]
            if not keep:
                break  # the last draft is never fed
            running = [running[r] for r in keep]
            g = g[torch.tensor(keep, device=g.device)] if len(keep) < g.shape[0] else g
            g = self._forward([(self._seqs[inputs[i].seq_id], [drafts[i][-1]], g[r : r + 1]) for r, i in enumerate(running)])

        # 3. Draft pairs leave the head's KV.
        for i in active:
            st = self._seqs[inputs[i].seq_id]
            self._slot(st).rollback(st.fed)
            out[i] = DraftProposal(tokens=drafts[i], probs=None)
        return out

    def rollback(self, seq_id: str, num_tokens: int) -> None:
        # The head's KV only ever holds committed pairs between calls (step 3), and
        # committed tokens never change: nothing to drop.
        pass

    def release(self, seq_id: str) -> None:
        st = self._seqs.pop(seq_id, None)
        if st is not None and st.slot is not None:
            self.kv_cache.free(st.slot)

    # ------------------------------------------------------------ internals

    def _ready(self, inp: ProposalInput, k: int) -> bool:
        """Every feature up to f_{n-2} is here and the sequence has a head region for its whole life."""
        st = self._seqs.get(inp.seq_id)
        n = len(inp.token_ids)
        if st is None or n < 2 or not st.fed < n - 1 <= st.fed + st.pending_rows:
            return False
        if st.slot is None:
            # Sized once, like the target's region: committed pairs plus draft slack.
            size = region_size(max(n, inp.num_prompt_tokens + inp.params.max_tokens), self.max_draft_tokens)
            st.slot = self.kv_cache.allocate(size)
        # n - 1 committed pairs, then at most k - 1 draft pairs.
        return st.slot is not None and st.slot.region.size >= n - 2 + k

    def _forward(self, feeds: list[tuple[_HeadSeq, list[int], Tensor]]) -> Tensor:
        """Feed each sequence its pairs (features [n_i, hidden], next tokens [n_i]) in one flat forward.

        Returns g of each sequence's last row, [len(feeds), hidden]."""
        builder = FlatBatchBuilder(self.device)
        slots = [self._slot(st) for st, _, _ in feeds]
        last_rows = [builder.add(toks, s.num_cached, s.region.start) + len(toks) - 1 for s, (_, toks, _) in zip(slots, feeds)]
        input_ids, positions, attn = builder.build(self.kv_cache)
        emb = self.target.embed(input_ids)  # [T, hidden]
        feats = torch.cat([f for _, _, f in feeds]).to(emb.dtype)  # [T, hidden]
        rope = self.target.rope_step(positions, emb.dtype)
        g = self.head.forward_flat(torch.cat([feats, emb], dim=-1), rope, attn)  # [T, hidden]
        for slot, (_, toks, _) in zip(slots, feeds):
            slot.num_cached += len(toks)
        return g[builder.tensor(last_rows)]

    @staticmethod
    def _slot(st: _HeadSeq) -> CacheSlot:
        if st.slot is None:  # _ready allocated it before any forward
            raise RuntimeError("head sequence without a KV region")
        return st.slot
