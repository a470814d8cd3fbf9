"""The per-step shortcuts of engine.model give exactly what the plain operations give:
a fused op may save dispatches, never change a bit (speculation's equality rests on it)."""
from __future__ import annotations

import pytest
import torch

from engine.model import RMSNorm


def _hf_order(norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    """HF's RMSNorm: normalise in fp32, cast back, then scale."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.eps)
    return norm.weight * x32.to(x.dtype)


@pytest.mark.parametrize("shape", [(1, 576), (9, 576), (130, 576), (5, 3, 64)])  # hidden rows; q/k heads (qwen3)
def test_the_fused_fp32_rms_norm_is_bit_identical_to_the_hf_order(shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    norm = RMSNorm(shape[-1], 1e-5)
    norm.weight.data = torch.randn(shape[-1])
    x = torch.randn(shape) * 3
    assert torch.equal(norm(x), _hf_order(norm, x))


def test_bf16_keeps_the_hf_order() -> None:
    norm = RMSNorm(64, 1e-6).to(torch.bfloat16)
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    assert torch.equal(norm(x), _hf_order(norm, x))
