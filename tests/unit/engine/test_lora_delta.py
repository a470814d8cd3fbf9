"""The LoRA delta of a mixed batch equals each row's own x A B (a per-row reference loop), and a row gets the same
bits alone as in any batch (the row kernel, engine/fused/lora_delta.h)."""
from __future__ import annotations

import pytest
import torch
from _engine_factories import single_thread, torch_threads  # noqa: F401 - the fixture
from torch import nn

from engine.lora.adapter import LoRAAdapter
from engine.lora.layers import LoRALinear, Part, StepRows, row_kernel_runs

pytestmark = pytest.mark.usefixtures("single_thread")


def _adapter(name: str, rank: int, in_f: int, sizes: dict[str, int], seed: int) -> LoRAAdapter:
    g = torch.Generator().manual_seed(seed)
    weights = {(0, p): (torch.randn(in_f, rank, generator=g), torch.randn(rank, n, generator=g))
               for p, n in sizes.items()}
    return LoRAAdapter(name=name, path="-", rank=rank, weights=weights)


@pytest.mark.parametrize("row_kernel", [True, False], ids=["row-kernel", "masked-gemm"])
def test_mixed_rows_get_their_own_adapters_delta(row_kernel: bool) -> None:
    in_f, sizes = 12, {"q_proj": 8, "k_proj": 4, "v_proj": 4}
    base = nn.Linear(in_f, 16, bias=False)
    rows = StepRows()
    lin = LoRALinear(base, [Part("q_proj", 0, 8), Part("k_proj", 8, 4), Part("v_proj", 12, 4)], in_f, rows)
    lin.allocate(n_slots=4, max_rank=6, device=torch.device("cpu"), dtype=torch.float32)
    assert lin.row_kernel == row_kernel_runs(torch.device("cpu"), torch.float32)
    lin.row_kernel = row_kernel  # the masked GEMMs: where the C++ ops do not run
    adapters = {1: _adapter("a", 2, in_f, sizes, 1), 2: _adapter("b", 6, in_f, sizes, 2),
                3: _adapter("c", 3, in_f, {"k_proj": 4}, 3)}  # c: LoRA on k only
    for slot, adapter in adapters.items():
        lin.write(slot, 0, adapter)
    # A prefill chunk of slot 2, base decodes, a verification of slot 1, slot 3, then base again.
    row_slots = [2, 2, 2, 2, 0, 1, 1, 1, 0, 3, 3, 0]
    x = torch.randn(len(row_slots), in_f)
    rows.set(row_slots, {s: a.rank for s, a in adapters.items()}, torch.device("cpu"), torch.float32)
    with torch.inference_mode():
        got = lin(x)  # [T, 16]
        want = base(x).clone()
        for t, slot in enumerate(row_slots):  # reference: one row at a time, its adapter's weights only
            if slot == 0:
                continue
            for part in lin.parts:
                pair = adapters[slot].weights.get((0, part.projection))
                if pair is not None:
                    want[t, part.offset : part.offset + part.size] += x[t] @ pair[0] @ pair[1]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert torch.equal(got[[4, 8, 11]], base(x)[[4, 8, 11]])  # base rows untouched, bit for bit


class _Columns(nn.Module):
    """A base linear whose rows cannot depend on the batch: the first `out` inputs, halved."""

    def __init__(self, out: int) -> None:
        super().__init__()
        self.out = out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, : self.out] * 0.5


@pytest.mark.parametrize("threads", [1, 2])
def test_a_rows_delta_has_the_same_bits_alone_as_in_any_mixed_batch(threads: int) -> None:
    """torch's fp32 GEMMs round a row by the call's row count (past 3 rows here) and column count (the step's
    adapters x their largest rank): the masked delta gave an adapter row other bits beside other requests, and
    int4 + LoRA other greedy text in a mixed batch than alone. The row kernel sums each row on its own."""
    assert row_kernel_runs(torch.device("cpu"), torch.float32)
    # Widths off the kernel's 8 lanes (tails), ranks 1, 5 and 8 (its groups of 4 and the rest), one adapter on q only.
    in_f, sizes = 76, {"q_proj": 20, "k_proj": 8, "v_proj": 8}
    rows = StepRows()
    lin = LoRALinear(_Columns(36), [Part("q_proj", 0, 20), Part("k_proj", 20, 8), Part("v_proj", 28, 8)], in_f, rows)
    lin.allocate(n_slots=4, max_rank=8, device=torch.device("cpu"), dtype=torch.float32)
    adapters = {1: _adapter("a", 1, in_f, {"q_proj": 20}, 1), 2: _adapter("b", 5, in_f, sizes, 2),
                3: _adapter("c", 8, in_f, sizes, 3)}
    for slot, adapter in adapters.items():
        lin.write(slot, 0, adapter)
    ranks = {s: a.rank for s, a in adapters.items()}
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode(), torch_threads(threads):
        for n in (2, 4, 5, 9, 16, 33, 64):
            x = torch.randn(n, in_f, generator=g)
            slots = torch.randint(0, 4, (n,), generator=g).tolist()
            rows.set(slots, ranks, torch.device("cpu"), torch.float32)
            mixed = lin(x)
            for t, slot in enumerate(slots):
                rows.set([slot], ranks, torch.device("cpu"), torch.float32)
                assert torch.equal(lin(x[t : t + 1])[0], mixed[t]), (n, t, slot)


def test_a_step_without_adapter_rows_is_the_base_linear() -> None:
    base = nn.Linear(6, 5)
    rows = StepRows()
    lin = LoRALinear(base, [Part("o_proj", 0, 5)], 6, rows)
    rows.set([0, 0, 0], {}, torch.device("cpu"), torch.float32)
    x = torch.randn(3, 6)
    with torch.inference_mode():
        assert torch.equal(lin(x), base(x))


def test_rows_set_for_another_batch_size_fail_loudly() -> None:
    rows = StepRows()
    lin = LoRALinear(nn.Linear(6, 5), [Part("o_proj", 0, 5)], 6, rows)
    lin.allocate(2, 2, torch.device("cpu"), torch.float32)
    lin.write(1, 0, _adapter("a", 2, 6, {"o_proj": 5}, 0))
    rows.set([1, 0], {1: 2}, torch.device("cpu"), torch.float32)
    with pytest.raises(RuntimeError, match="2 rows"), torch.inference_mode():
        lin(torch.randn(3, 6))
