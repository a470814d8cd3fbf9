"""A sparse mixture-of-experts MLP (Mixtral's): a router picks each token's top-k experts, whose SiLU-gated MLPs
are summed with the router's renormalised weights.

Each expert's projections are linears of their own (experts.E.gate_up_proj, experts.E.down_proj), so every weight
format installs into them as into a dense MLP's; the router stays in the model's float dtype (it is small, and a
quantized router would pick other experts than the checkpoint's)."""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from engine.decoder_config import DecoderConfig

Take = Callable[[str], torch.Tensor]


class Router(nn.Module):
    """[T, H] -> [T, E] logits; not an nn.Linear, so weight formats leave it be."""

    def __init__(self, hidden: int, experts: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(experts, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class Expert(nn.Module):
    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.intermediate_size = cfg.intermediate_size
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)  # 2 x [t, I]
        return self.down_proj(F.silu(gate) * up)  # [t, H]


class SparseMoE(nn.Module):
    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.top_k = cfg.experts_per_token
        self.router = Router(cfg.hidden_size, cfg.num_experts)
        self.experts = nn.ModuleList(Expert(cfg) for _ in range(cfg.num_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, H]
        probs = F.softmax(self.router(x).float(), dim=-1)  # [T, E], in fp32 as HF routes
        weights, experts = torch.topk(probs, self.top_k, dim=-1)  # [T, k]
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(x)
        for e in experts.unique().tolist():
            rows, slot = torch.where(experts == e)  # the tokens routed to e, and where e is among their k
            out.index_add_(0, rows, self.experts[e](x[rows]) * weights[rows, slot, None])
        return out


def expert_tensors(
    cfg: DecoderConfig, take: Take, has: Callable[[str], bool], p: str, ours: str
) -> dict[str, torch.Tensor]:
    """One layer's router and experts, from either layout a Mixtral checkpoint comes in: transformers 5's stacked
    ``mlp.experts.gate_up_proj`` [E, 2I, H] / ``down_proj`` [E, H, I], or the Hub files' per-expert
    ``block_sparse_moe.experts.E.w1`` (gate), ``w3`` (up) and ``w2`` (down)."""
    if has(p + "block_sparse_moe.gate.weight"):
        e = p + "block_sparse_moe.experts."
        out = {ours + "router.weight": take(p + "block_sparse_moe.gate.weight")}
        for x in range(cfg.num_experts):
            out[f"{ours}experts.{x}.gate_up_proj.weight"] = torch.cat([take(f"{e}{x}.w1.weight"),
                                                                     take(f"{e}{x}.w3.weight")])
            out[f"{ours}experts.{x}.down_proj.weight"] = take(f"{e}{x}.w2.weight")
        return out
    gate_up, down = take(p + "mlp.experts.gate_up_proj"), take(p + "mlp.experts.down_proj")
    out = {ours + "router.weight": take(p + "mlp.gate.weight")}
    for x in range(cfg.num_experts):  # views: no second copy (a format that replaces them all frees the stack)
        out[f"{ours}experts.{x}.gate_up_proj.weight"] = gate_up[x]
        out[f"{ours}experts.{x}.down_proj.weight"] = down[x]
    return out
