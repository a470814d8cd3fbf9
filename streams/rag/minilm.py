"""all-MiniLM-L6-v2's encoder (a 6-layer BERT) in plain torch, read from the package's safetensors.

transformers' ``BertModel`` computes the same states (tests/unit/test_rag_encoder.py compares them), but importing
its modeling code imports torch's compiler stack (``masking_utils`` imports ``torch._dynamo``): about 2.5 s of
every rag service start on 2 cores, for nothing it uses. Module names follow BERT's checkpoint names, so the
file loads as it is (its pooler, unused by mean pooling, is skipped).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from engine.meta_init import skeleton


@dataclass(frozen=True)
class BertShape:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float

    @classmethod
    def from_config(cls, path: Path) -> BertShape:
        config = json.loads(path.read_text())
        if config.get("model_type") != "bert" or config.get("hidden_act") != "gelu" or \
                config.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"{path}: not a BERT encoder with gelu and absolute positions, which is all this reads")
        return cls(**{name: config[name] for name in cls.__dataclass_fields__})


class _Embeddings(nn.Module):
    def __init__(self, s: BertShape) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(s.vocab_size, s.hidden_size)
        self.position_embeddings = nn.Embedding(s.max_position_embeddings, s.hidden_size)
        self.token_type_embeddings = nn.Embedding(s.type_vocab_size, s.hidden_size)
        self.LayerNorm = nn.LayerNorm(s.hidden_size, eps=s.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # [batch, seq] -> [batch, seq, hidden]
        positions = torch.arange(input_ids.shape[1])
        # Every token is of segment 0 (one sentence per window); summed in BERT's order, so the bits are its bits.
        summed = self.word_embeddings(input_ids) + self.token_type_embeddings.weight[0]
        return self.LayerNorm(summed + self.position_embeddings(positions))


class _Dense(nn.Module):
    """A linear layer, with the residual and LayerNorm BERT puts after it where ``norm_eps`` is given."""

    def __init__(self, d_in: int, d_out: int, norm_eps: float | None = None) -> None:
        super().__init__()
        self.dense = nn.Linear(d_in, d_out)
        if norm_eps is not None:
            self.LayerNorm = nn.LayerNorm(d_out, eps=norm_eps)


class _SelfAttention(nn.Module):
    def __init__(self, s: BertShape) -> None:
        super().__init__()
        self.heads = s.num_attention_heads
        self.query = nn.Linear(s.hidden_size, s.hidden_size)
        self.key = nn.Linear(s.hidden_size, s.hidden_size)
        self.value = nn.Linear(s.hidden_size, s.hidden_size)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        b, n, h = x.shape
        q, k, v = (proj(x).view(b, n, self.heads, h // self.heads).transpose(1, 2)
                   for proj in (self.query, self.key, self.value))  # each [batch, heads, seq, head_dim]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)  # keep: [batch, 1, 1, seq], True = a real token
        return out.transpose(1, 2).reshape(b, n, h)


class _Attention(nn.Module):
    def __init__(self, s: BertShape) -> None:
        super().__init__()
        self.self = _SelfAttention(s)
        self.output = _Dense(s.hidden_size, s.hidden_size, s.layer_norm_eps)


class _Layer(nn.Module):
    def __init__(self, s: BertShape) -> None:
        super().__init__()
        self.attention = _Attention(s)
        self.intermediate = _Dense(s.hidden_size, s.intermediate_size)
        self.output = _Dense(s.intermediate_size, s.hidden_size, s.layer_norm_eps)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        attended = self.attention.output
        x = attended.LayerNorm(x + attended.dense(self.attention.self(x, keep)))
        return self.output.LayerNorm(x + self.output.dense(F.gelu(self.intermediate.dense(x))))


class _Encoder(nn.Module):
    def __init__(self, s: BertShape) -> None:
        super().__init__()
        self.layer = nn.ModuleList(_Layer(s) for _ in range(s.num_hidden_layers))


class MiniLM(nn.Module):
    """Token ids and their attention mask -> the last hidden states ([batch, seq, hidden])."""

    def __init__(self, shape: BertShape) -> None:
        super().__init__()
        self.shape = shape
        self.embeddings = _Embeddings(shape)
        self.encoder = _Encoder(shape)

    @classmethod
    def load(cls, folder: Path) -> MiniLM:
        with skeleton():
            model = cls(BertShape.from_config(folder / "config.json"))
        tensors = load_file(folder / "model.safetensors")
        wanted = {name: tensor for name, tensor in tensors.items()
                  if not name.startswith("pooler.") and name != "embeddings.position_ids"}
        model.load_state_dict(wanted, strict=True, assign=True)
        return model.eval()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        keep = attention_mask.bool()[:, None, None, :]
        x = self.embeddings(input_ids)
        for layer in self.encoder.layer:
            x = layer(x, keep)
        return x
