"""The EAGLE draft head: one decoder layer that predicts the target's next hidden state.

Li et al. 2024 (EAGLE): at position j the head reads concat(f_j, e(x_{j+1})),
the target's final-normed hidden state of token j and the embedding of the
token after it, squeezes it to the hidden size (`fc`), runs one decoder layer
(attention over the head's own KV of earlier positions) and outputs g_j, its
guess of f_{j+1}. The target's LM head turns g_j into a draft of x_{j+2}; the
next draft position feeds concat(g_j, e(draft)). Embedding and LM head are the
target's, so the head adds one layer's weights (~5M parameters for SmolLM2-135M).

The LM head is restricted to a draft vocabulary: the tokens seen most often in
the training data (EAGLE-3, FR-Spec). A full 49k-row LM head would cost more
per draft position than the layer itself, on CPU as much as a fifth of a target
step; 8k rows are cheap, and a token outside them is simply never drafted.

This module holds the network and the target fingerprint; eagle_artifact.py
reads and writes it, eagle.py drafts with it, eagle_train.py trains it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json

import torch
import torch.nn.functional as F
from torch import nn

from engine.model import (
    AttentionMetadata,
    Decoder,
    DecoderConfig,
    DecoderLayer,
)
from engine.rotary import RopeStep, rotate_half


def target_fingerprint(target: Decoder) -> str:
    """16 hex digits identifying the target a head was trained for.

    Hashes the architecture and the embedding and LM-head weights, the tensors
    the head shares. Weights are hashed in bf16 so the same checkpoint loaded in
    fp32 or bf16 matches (a head trained on one serves the other), while a
    different model, or the same one fine-tuned, does not.
    """
    cfg = {k: v for k, v in dataclasses.asdict(target.cfg).items() if k != "max_position_embeddings"}
    h = hashlib.sha256(json.dumps(cfg, sort_keys=True).encode())
    tensors = [target.embed_tokens.weight] + ([] if target.lm_head is None else [target.lm_head.weight])
    for t in tensors:
        if not t.is_floating_point():
            raise ValueError("the target's embedding is quantized: fingerprint it before engine.weights applies")
        h.update(t.detach().to("cpu", torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes())
    return h.hexdigest()[:16]


def head_decoder_config(target_cfg: DecoderConfig) -> DecoderConfig:
    """The head's layer has the shapes of one target layer."""
    return dataclasses.replace(target_cfg, num_layers=1)


class EagleHead(nn.Module):
    """fc + one decoder layer; the LM head rows for the draft vocabulary are bound from the target."""

    def __init__(self, cfg: DecoderConfig, draft_vocab: torch.Tensor) -> None:
        super().__init__()
        self.cfg = head_decoder_config(cfg)
        hidden = cfg.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=True)
        self.layer = DecoderLayer(self.cfg, 0)
        # [Vd] int64: target token id of each draft-vocabulary entry.
        self.draft_vocab: torch.Tensor
        self.register_buffer("draft_vocab", draft_vocab.to(torch.long), persistent=True)
        # [Vd, hidden]: the target's LM-head rows for draft_vocab (bind); not saved, it is the target's.
        self.head_weight: torch.Tensor | None = None
        # Those rows in the served weight format (follow_weight_format); None: F.linear on head_weight.
        self.head_matmul: nn.Module | None = None

    @property
    def vocab_size(self) -> int:
        return int(self.draft_vocab.shape[0])

    def bind(self, target: Decoder) -> None:
        """Take the LM-head rows of the draft vocabulary from the target (fp weights, before quantization)."""
        weight = target.embed_tokens.weight if target.lm_head is None else target.lm_head.weight
        rows = weight.detach()[self.draft_vocab.to(weight.device)]  # [Vd, hidden]
        self.head_weight = rows.to(self.fc.weight.device, self.fc.weight.dtype).contiguous()

    def follow_weight_format(self, fmt: str, kernel: str = "auto") -> None:
        """Serve on CPU (after bind), whatever the target's format (engine.weights fp32/bf16/int8/int4): every
        linear and the draft LM head int8 per row, on the target's int8 kernel. The fp32 head cost 3.7 ms a draft
        position beside a 5 ms int4 step, int8 ~1 ms with the same acceptance, where int4 weights lost a third of
        the accepted tokens; beside an fp32 target three fp32 drafts took 10.8 ms of a 43 ms step, int8 2.4 ms
        (54e26a1:docs/benchmarks.md). Drafts stay this head's argmax: speculation stays lossless."""
        if self.head_weight is None:
            raise RuntimeError("EagleHead.bind(target) comes before follow_weight_format")
        if self.fc.weight.device.type != "cpu":
            return  # the int8 kernels are CPU kernels
        from engine.quant.apply import HEAD_FORMAT, narrow_linear, quantize_linears

        quantize_linears(self, HEAD_FORMAT, kernel)
        self.head_matmul = narrow_linear(self.head_weight, None, HEAD_FORMAT, kernel)
        self.head_weight = None  # the int8 copy is the only one kept

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        """g [..., hidden] -> fp32 logits [..., Vd] over the draft vocabulary."""
        if self.head_matmul is not None:
            return self.head_matmul(g).float()
        if self.head_weight is None:
            raise RuntimeError("EagleHead.bind(target) was not called")
        return F.linear(g, self.head_weight).float()

    def draft_ids(self, g: torch.Tensor) -> torch.Tensor:
        """g [n, hidden] -> [n] target token ids: the argmax over the draft vocabulary."""
        return self.draft_vocab[self.logits(g).argmax(dim=-1)]

    def forward_flat(self, x: torch.Tensor, rope: RopeStep, attn: AttentionMetadata) -> torch.Tensor:
        """x [T, 2 * hidden] = concat(feature, next-token embedding) -> g [T, hidden], writing the head's KV."""
        return self.layer(self.fc(x), rope, attn)

    def forward_train(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [B, L, 2 * hidden] (padding at the end) -> g [B, L, hidden]; plain causal attention, no KV cache.

        The same layer as forward_flat, written batched so autograd runs through it
        (the flat path writes an inference KV arena in place). cos, sin [L, head_dim].
        """
        return self.forward_rollout(x, x[..., self.cfg.hidden_size :], cos, sin, depth=1)[0]

    def forward_rollout(
        self, x: torch.Tensor, emb: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, depth: int
    ) -> list[torch.Tensor]:
        """Training-time test (EAGLE-3): what the head outputs at draft depths 1..depth, as serving drafts.

        x [B, L, 2 * hidden]: depth 1's inputs concat(f_j, e(x_{j+1})); emb [B, L, hidden]: e(x_{j+1}).
        Depth d at position j reads concat(g_{d-1} at j - 1, e(x_{j+1})), the head's own guess of f_j, and
        attends as the d-th draft does in serving: to depth 1's keys up to j - d + 1 (the committed pairs)
        and to depth m's key at j - d + m for m = 2..d (the earlier drafts of its chain). Returns
        [g_1, ..., g_depth], each [B, L, hidden]; g_d at positions j < d - 1 has no chain and is not meaningful.
        """
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        outs: list[torch.Tensor] = []
        L = x.shape[1]
        for d in range(1, depth + 1):
            if d > 1:
                prev = F.pad(outs[-1][:, :-1], (0, 0, 1, 0))  # [B, L, H]: g_{d-1} at j - 1, zeros at j = 0
                x = torch.cat([prev, emb], dim=-1)
            h = self.fc(x)  # [B, L, hidden]
            q, k, v = self._train_qkv(h, cos, sin)  # [B, Hq, L, D], [B, Hkv, L, D] x 2
            keys.append(k)
            values.append(v)
            if d == 1:
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # [B, Hq, L, D]
            else:
                mask = _rollout_mask(L, d, h.device)  # [L, d * L]
                out = F.scaled_dot_product_attention(
                    q, torch.cat(keys, dim=2), torch.cat(values, dim=2), attn_mask=mask, enable_gqa=True
                )
            outs.append(self._train_finish(h, out))
        return outs

    def _train_qkv(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        layer, c = self.layer, self.cfg
        a = layer.self_attn
        B, L, _ = h.shape
        qkv = a.qkv_proj(layer.input_layernorm(h))  # [B, L, q + 2kv]
        q, k, v = qkv.split([a.q_size, a.kv_size, a.kv_size], dim=-1)
        q = q.view(B, L, c.num_heads, c.head_dim).transpose(1, 2)  # [B, Hq, L, D]
        k = k.view(B, L, c.num_kv_heads, c.head_dim).transpose(1, 2)  # [B, Hkv, L, D]
        v = v.view(B, L, c.num_kv_heads, c.head_dim).transpose(1, 2)
        if a.q_norm is not None and a.k_norm is not None:
            q, k = a.q_norm(q), a.k_norm(k)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin, v

    def _train_finish(self, h: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        """h [B, L, hidden], attn_out [B, Hq, L, D] -> the layer's output [B, L, hidden]."""
        layer = self.layer
        B, L, _ = h.shape
        h = h + layer.self_attn.o_proj(attn_out.transpose(1, 2).reshape(B, L, layer.self_attn.q_size))
        return h + layer.mlp(layer.post_attention_layernorm(h))


def _rollout_mask(L: int, depth: int, device: torch.device) -> torch.Tensor:
    """[L, depth * L] bool: query j of draft depth `depth` sees depth 1's keys 0..j - depth + 1 and
    depth m's key j - depth + m (m = 2..depth). Key block m - 1 holds depth m's keys."""
    j = torch.arange(L, device=device)[:, None]  # [L, 1]
    p = torch.arange(L, device=device)[None, :]  # [1, L]
    blocks = [p <= j - depth + 1] + [p == j - depth + m for m in range(2, depth + 1)]
    return torch.cat(blocks, dim=1)  # [L, depth * L]; the last block's diagonal is the query's own key


def init_from_target(head: EagleHead, target: Decoder) -> None:
    """Start the layer from the target's last layer: a better start than random for a short CPU training."""
    last = target.layers[len(target.layers) - 1]
    state = {k: v.detach().clone().float() for k, v in last.state_dict().items()}
    head.layer.load_state_dict(state, strict=True)
