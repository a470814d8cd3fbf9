"""Draft-model proposer: a small model sharing the target's tokenizer drafts k tokens.

The draft runs on our own decoder (engine.model.Decoder) with its own KV arena
(engine.kv_cache.KVCache), one contiguous region per sequence, like the target.

Per propose call, batched across sequences:
1. catch up: feed each sequence the committed tokens the draft has not seen
   (the whole prompt on first use, afterwards the tokens accepted in the last
   step plus the target's correction / bonus token). Stale draft KV, from
   drafts the target rejected, is found by comparing the tokens the draft was
   fed with the committed ones, and dropped: rolling back is O(1).
2. draft: one forward per draft position for all sequences still drafting;
   each forward feeds the previous draft token and yields the next.

How a sampled (temperature > 0) request drafts is `SpeculationConfig.draft_sampling`
(see there): "greedy" (default) and "coupled" are deterministic given the
prefix and the seed, so the verifier's coupled rule keeps the text identical
to non-speculative sampling and a redelivered request reproduces it whatever
draft lengths the controller picks; "sampled" returns q for the rejection rule
(better acceptance in theory, no such reproducibility). Greedy requests always
draft the argmax.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from engine.config import SpeculationConfig
from engine.kv_cache import CacheSlot, KVCache, kv_budget_bytes, kv_bytes_per_token, region_size
from engine.model import Decoder
from engine.runner import FlatBatchBuilder
from engine.sampler import STREAM_DRAFT, STREAM_SAMPLE, NoiseKey, exponential_noise, race, target_probs
from engine.speculative.config import SpeculationTuning
from engine.speculative.proposer import EMPTY_PROPOSAL, DraftProposal, ProposalInput

if TYPE_CHECKING:
    from engine.loader import LoadedModel


class DraftModelMismatch(ValueError):
    """The draft model cannot serve this target (a startup error)."""


# ---------------------------------------------------------------- compatibility


_SPECIAL_IDS = ("bos_token_id", "eos_token_id", "unk_token_id")


def _vocab_of(tokenizer: Any) -> Mapping[str, int] | None:
    get_vocab = getattr(tokenizer, "get_vocab", None)
    return get_vocab() if callable(get_vocab) else None


def check_draft_compatible(
    target_name: str,
    target_tokenizer: Any,
    target_vocab_size: int,
    draft_name: str,
    draft_tokenizer: Any,
    draft_vocab_size: int | None,
) -> None:
    """Raise DraftModelMismatch unless the draft speaks the target's token ids.

    Drafts are token ids that the target verifies, so both must map every
    token string to the same id: the tokenizers' vocabularies (get_vocab(),
    added tokens included) must be equal, and so must the special tokens
    (BOS, EOS, UNK). The models' embedding sizes may differ when the tokenizers
    agree (checkpoints pad their vocabulary to different multiples); the
    proposer then only ever drafts ids below the target's size. Without
    comparable tokenizers the embedding sizes must match exactly.
    draft_vocab_size None: the draft's weights are not loaded yet (tokenizers only).
    """
    hint = "a draft must share the target's tokenizer"
    t_vocab, d_vocab = _vocab_of(target_tokenizer), _vocab_of(draft_tokenizer)
    if t_vocab is not None and d_vocab is not None:
        if len(d_vocab) != len(t_vocab):
            raise DraftModelMismatch(
                f"draft model {draft_name} has vocab {len(d_vocab)} tokens, target {target_name} has "
                f"{len(t_vocab)}: {hint}"
            )
        if d_vocab != t_vocab:
            diff = sorted(tok for tok in t_vocab if d_vocab.get(tok) != t_vocab[tok])
            tok = diff[0]
            where = f"id {d_vocab[tok]}" if tok in d_vocab else "no id"
            raise DraftModelMismatch(
                f"draft model {draft_name} maps token {tok!r} to {where}, target {target_name} to id {t_vocab[tok]} "
                f"({len(diff)} tokens differ): {hint}"
            )
        for attr in _SPECIAL_IDS:
            t_id, d_id = getattr(target_tokenizer, attr, None), getattr(draft_tokenizer, attr, None)
            if t_id != d_id:
                raise DraftModelMismatch(
                    f"draft model {draft_name} has {attr} {d_id}, target {target_name} has {t_id}: {hint}"
                )
        if draft_vocab_size is not None:
            for name, size in ((draft_name, draft_vocab_size), (target_name, target_vocab_size)):
                if size < len(t_vocab):
                    raise DraftModelMismatch(
                        f"model {name} has {size} embedding rows for a tokenizer of {len(t_vocab)} tokens"
                    )
        return
    if draft_vocab_size is not None and draft_vocab_size != target_vocab_size:
        raise DraftModelMismatch(
            f"draft model {draft_name} has vocab {draft_vocab_size} tokens, target {target_name} has "
            f"{target_vocab_size}: {hint}"
        )


# ---------------------------------------------------------------- proposer


@dataclass
class _DraftSeq:
    slot: CacheSlot
    fed: list[int] = field(default_factory=list)  # tokens whose KV is in the slot, in order
    verified: int = 0  # fed[:verified] is known to equal the committed tokens


_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


class DraftModelProposer:
    def __init__(
        self,
        model: Decoder,
        cfg: SpeculationConfig,
        target_vocab_size: int,
        kv_cache_tokens: int,
        name: str = "draft",
    ) -> None:
        """model: the draft decoder, RoPE initialised; kv_cache_tokens: size of its arena."""
        self.model = model
        self.cfg = cfg
        self.name = name
        self.target_vocab_size = target_vocab_size
        mc = model.cfg
        self.kv_cache = KVCache(mc.num_layers, mc.num_kv_heads, mc.head_dim, kv_cache_tokens, model.dtype, model.device)
        self.device = model.device
        self._seqs: dict[str, _DraftSeq] = {}

    @classmethod
    def from_engine(
        cls,
        cfg: SpeculationConfig,
        target: LoadedModel,
        max_model_len: int | None = None,
        max_running_requests: int | None = None,
        tuning: SpeculationTuning | None = None,
    ) -> "DraftModelProposer":
        """Load cfg.draft_model next to the loaded target (same device and dtype),
        refusing a draft that does not share the target's tokenizer. The
        tokenizers are compared before the draft's weights are loaded."""
        from engine.loader import load_model
        from engine.model_text import load_tokenizer

        if not cfg.draft_model:
            raise ValueError("speculation method draft needs draft_model (a path or model name)")
        target_vocab = target.model.cfg.vocab_size
        draft_tok = load_tokenizer(cfg.draft_model)
        check_draft_compatible(target.name, target.tokenizer, target_vocab, cfg.draft_model, draft_tok, None)
        dtype = _DTYPE_NAMES.get(target.dtype, "auto")
        draft = load_model(cfg.draft_model, device=str(target.device), dtype=dtype)
        check_draft_compatible(
            target.name, target.tokenizer, target_vocab, cfg.draft_model, draft.tokenizer, draft.model.cfg.vocab_size
        )
        mc = draft.model.cfg
        per_token = kv_bytes_per_token(mc.num_layers, mc.num_kv_heads, mc.head_dim, draft.dtype)
        arena = tuning or SpeculationTuning()
        budget = kv_budget_bytes(draft.device, arena.draft_kv_cache_bytes, arena.draft_kv_cache_fraction)
        tokens = budget // per_token
        if max_model_len is not None and max_running_requests is not None:
            tokens = min(tokens, max_running_requests * region_size(max_model_len, cfg.max_draft_tokens))
        if tokens <= 0:
            raise ValueError(f"the draft KV budget of {budget} bytes holds no token ({per_token} bytes per token)")
        return cls(draft.model, cfg, target_vocab, int(tokens), name=cfg.draft_model)

    # ------------------------------------------------------------ Proposer API

    @torch.inference_mode()
    def propose(self, inputs: list[ProposalInput], num_tokens: list[int]) -> list[DraftProposal]:
        if len(inputs) != len(num_tokens):
            raise ValueError(f"got {len(inputs)} inputs but {len(num_tokens)} draft lengths")
        out: list[DraftProposal] = [EMPTY_PROPOSAL] * len(inputs)
        max_pos = self.model.max_positions
        active: list[int] = []  # indexes into inputs that draft this call
        ks: dict[int, int] = {}
        for i, (inp, k) in enumerate(zip(inputs, num_tokens)):
            length = len(inp.token_ids)
            # The last draft token is never fed, so drafting k needs positions up to length + k - 2.
            k = min(k, max_pos - length + 1)
            if k <= 0 or length == 0:
                continue
            st = self._state(inp, length + k - 1)  # positions up to length + k - 2 get KV
            if st is None:
                continue  # no room in the draft arena right now: no drafts this step
            ks[i] = k
            active.append(i)
        if not active:
            return out

        # 1. Catch up: every committed token the draft has not seen (at least the last one).
        feeds: list[tuple[_DraftSeq, list[int]]] = []
        for i in active:
            st, tokens = self._seqs[inputs[i].seq_id], inputs[i].token_ids
            self._sync(st, tokens)
            feeds.append((st, tokens[st.slot.num_cached :]))
        logits = self._forward(feeds)  # [n_active, V_target]
        for i in active:
            self._seqs[inputs[i].seq_id].verified = len(inputs[i].token_ids)  # all fed tokens are committed ones

        # 2. Draft one position at a time, batched over the sequences still drafting.
        drafts: dict[int, list[int]] = {i: [] for i in active}
        qs: dict[int, list[Tensor]] = {i: [] for i in active}
        running = list(active)
        step = 0
        while True:
            tokens_now = self._pick(logits, [inputs[i] for i in running], step, [qs[i] for i in running])
            for i, tok in zip(running, tokens_now):
                drafts[i].append(tok)
            running_next = [i for i in running if len(drafts[i]) < ks[i]]
            if not running_next:
                break  # the last draft token is not fed: its KV is only needed if accepted
            feeds = [(self._seqs[inputs[i].seq_id], [drafts[i][-1]]) for i in running_next]
            logits = self._forward(feeds)  # [len(running_next), V_target]
            running = running_next
            step += 1

        for i in active:
            probs = torch.stack(qs[i]) if qs[i] else None  # [k, V_target]
            out[i] = DraftProposal(tokens=drafts[i], probs=probs)
        return out

    def rollback(self, seq_id: str, num_tokens: int) -> None:
        st = self._seqs.get(seq_id)
        if st is None:
            return
        # Positions >= num_tokens no longer exist; below that, tokens are
        # compared with the committed ones at the next propose (drafts the
        # target rejected sit there with the wrong KV).
        keep = min(st.slot.num_cached, num_tokens)
        st.slot.rollback(keep)
        del st.fed[keep:]
        st.verified = min(st.verified, keep)

    def release(self, seq_id: str) -> None:
        st = self._seqs.pop(seq_id, None)
        if st is not None:
            self.kv_cache.free(st.slot)

    # ------------------------------------------------------------ internals

    def _state(self, inp: ProposalInput, needed: int) -> _DraftSeq | None:
        st = self._seqs.get(inp.seq_id)
        if st is not None and st.slot.region.size >= needed:
            return st
        if st is not None:  # outgrew its region (max_tokens larger than planned): move
            self.release(inp.seq_id)
        # Size the region for the sequence's whole life, like the target's.
        size = max(needed, region_size(inp.num_prompt_tokens + inp.params.max_tokens, self.cfg.max_draft_tokens))
        size = min(size, max(needed, self.model.max_positions + 1))
        slot = self.kv_cache.allocate(size)
        if slot is None:
            return None
        st = _DraftSeq(slot=slot)
        self._seqs[inp.seq_id] = st
        return st

    @staticmethod
    def _sync(st: _DraftSeq, tokens: list[int]) -> None:
        """Drop cached KV that does not match the committed tokens; keep >= 1 token to feed."""
        limit = min(st.slot.num_cached, len(tokens) - 1)  # the last token is always (re)fed
        m = min(st.verified, limit)
        while m < limit and st.fed[m] == tokens[m]:
            m += 1
        st.slot.rollback(m)
        del st.fed[m:]
        st.verified = m

    def _forward(self, feeds: list[tuple[_DraftSeq, list[int]]]) -> Tensor:
        """Feed each sequence its tokens in one flat forward. Returns the logits
        of each sequence's last fed row, [len(feeds), V_target] fp32."""
        builder = FlatBatchBuilder(self.device)
        last_rows = [builder.add(toks, st.slot.num_cached, st.slot.region.start) + len(toks) - 1 for st, toks in feeds]
        hidden = self.model(*builder.build(self.kv_cache))  # [T, hidden]
        logits = self.model.compute_logits(hidden[builder.tensor(last_rows)])  # [n, V_draft]
        for st, toks in feeds:
            st.slot.num_cached += len(toks)
            st.fed.extend(toks)
        return self._to_target_vocab(logits)

    def _to_target_vocab(self, logits: Tensor) -> Tensor:
        """[n, V_draft] -> [n, V_target]: ids past the target's vocabulary are cut,
        ids the draft lacks (smaller padding) can never be drafted."""
        vd, vt = logits.shape[1], self.target_vocab_size
        if vd == vt:
            return logits
        if vd > vt:
            return logits[:, :vt]
        pad = torch.full((logits.shape[0], vt - vd), float("-inf"), dtype=logits.dtype, device=logits.device)
        return torch.cat([logits, pad], dim=1)

    def _pick(self, logits: Tensor, inputs: list[ProposalInput], step: int, qs: list[list[Tensor]]) -> list[int]:
        """The draft token of each row at draft position `step`; appends q rows for "sampled"."""
        mode = self.cfg.draft_sampling
        picks = logits.argmax(dim=-1)  # [n]; greedy drafting and the fallback
        rows = [r for r, inp in enumerate(inputs) if not inp.params.greedy and inp.rng is not None]
        if mode != "greedy" and rows:
            stream = STREAM_SAMPLE if mode == "coupled" else STREAM_DRAFT
            keys: list[NoiseKey] = []
            for r in rows:
                inp = inputs[r]
                rng = inp.rng
                if rng is None:  # filtered above; keeps the type checker informed
                    continue
                keys.append(rng.key(inp.next_position + step, stream))
            idx = torch.tensor(rows, device=logits.device)
            q = target_probs(logits[idx], [inputs[r].params for r in rows])  # [m, V]
            # "coupled": the same noise as the target's own sample at this output
            # position, so the draft matches the target's sample whenever q is
            # close to p. "sampled": the draft's own stream, independent of the
            # verifier's accept / residual streams as the rejection rule needs.
            picks[idx] = race(q, exponential_noise(keys, logits.shape[1], logits.device))
            if mode == "sampled":
                for j, r in enumerate(rows):
                    qs[r].append(q[j])
        return picks.tolist()
