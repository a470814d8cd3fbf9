"""Prepacked linear layers: the oneDNN copy is an exact-enough twin of the plain weight,
used only for the row counts it is configured for, and invisible to the model's state."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from engine.model import Decoder
from engine.packed_linear import PackedRows, PrepackedLinear, packing_available, prepack_linears
from tests.unit.engine._engine_factories import tiny_hf_model



def test_this_torch_can_prepack_cpu_weights() -> None:
    # The project's torch (PyPI, x86-64) ships oneDNN; without it the engine would
    # silently run every step on the plain weights.
    assert packing_available(torch.device("cpu"), torch.float32)
    assert packing_available(torch.device("cpu"), torch.bfloat16)


@pytest.mark.parametrize("bias", [False, True])
def test_prepacked_linear_matches_plain_linear_at_every_row_count(bias: bool) -> None:
    torch.manual_seed(0)
    plain = nn.Linear(96, 200, bias=bias).eval().requires_grad_(False)
    packed = PrepackedLinear(plain, PackedRows(min_rows=4, max_rows=16))
    for rows in (1, 3, 4, 9, 16, 17, 64):
        x = torch.randn(rows, 96)
        torch.testing.assert_close(packed(x), plain(x), rtol=1e-5, atol=1e-5)


def test_only_rows_inside_the_window_take_the_packed_path(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = torch.ops.mkldnn._linear_pointwise

    def spy(x: torch.Tensor, *args: object) -> torch.Tensor:
        calls.append(x.shape[0])
        return real(x, *args)

    packed = PrepackedLinear(nn.Linear(32, 32, bias=False).requires_grad_(False), PackedRows(min_rows=4, max_rows=8))
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", spy)
    for rows in (1, 3, 4, 8, 9, 100):
        packed(torch.randn(rows, 32))
    assert calls == [4, 8]


def test_prepacking_a_decoder_keeps_its_state_and_its_logits() -> None:
    hf = tiny_hf_model("qwen2")  # tied embeddings: the LM head is the embedding
    model = Decoder.from_hf(hf, max_positions=64)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    hidden = torch.randn(9, model.cfg.hidden_size)
    logits = model.compute_logits(hidden)

    assert model.prepack_for_cpu()
    assert not any(type(m) is nn.Linear for m in model.layers.modules())
    after = model.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], before[k]) for k in before)
    torch.testing.assert_close(model.compute_logits(hidden), logits, rtol=1e-5, atol=1e-5)


def test_prepack_linears_counts_what_it_replaced() -> None:
    net = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 4)))
    assert prepack_linears(net, PackedRows()) == 2
    assert prepack_linears(net, PackedRows()) == 0  # already packed


def test_prepacking_does_not_apply_to_half_precision() -> None:
    model = Decoder.from_hf(tiny_hf_model("llama").half(), max_positions=64)
    assert not model.prepack_for_cpu()
    assert any(type(m) is nn.Linear for m in model.modules())


def test_packed_rows_must_be_a_valid_window() -> None:
    with pytest.raises(ValueError, match="min_rows"):
        PackedRows(min_rows=0)
    with pytest.raises(ValueError, match="min_rows"):
        PackedRows(min_rows=9, max_rows=4)
