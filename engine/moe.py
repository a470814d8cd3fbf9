"""A sparse mixture-of-experts MLP (Mixtral's): a router picks each token's top-k experts, whose SiLU-gated MLPs
are summed with the router's renormalised weights."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.decoder_config import DecoderConfig


class SparseMoE(nn.Module):
    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.top_k = cfg.experts_per_token
        self.intermediate_size = cfg.intermediate_size
        self.router = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        # Every expert's gate and up rows in one tensor, as the checkpoint has them.
        self.gate_up = nn.Parameter(torch.empty(cfg.num_experts, 2 * cfg.intermediate_size, cfg.hidden_size))
        self.down = nn.Parameter(torch.empty(cfg.num_experts, cfg.hidden_size, cfg.intermediate_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, H]
        probs = F.softmax(self.router(x).float(), dim=-1)  # [T, E], in fp32 as HF routes
        weights, experts = torch.topk(probs, self.top_k, dim=-1)  # [T, k]
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(x)
        for e in experts.unique().tolist():
            rows, slot = torch.where(experts == e)  # the tokens routed to e, and where e is among their k
            gate, up = F.linear(x[rows], self.gate_up[e]).split(self.intermediate_size, dim=-1)  # 2 x [t, I]
            y = F.linear(F.silu(gate) * up, self.down[e]) * weights[rows, slot, None]  # [t, H]
            out.index_add_(0, rows, y)
        return out
