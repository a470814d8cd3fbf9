"""The gathered LoRA delta of a mixed batch equals each row's own x A B (a per-row reference loop)."""
from __future__ import annotations

import pytest
import torch
from _engine_factories import single_thread  # noqa: F401 - the fixture
from torch import nn

from engine.lora.adapter import LoRAAdapter
from engine.lora.layers import LoRALinear, Part, StepRows

pytestmark = pytest.mark.usefixtures("single_thread")


def _adapter(name: str, rank: int, in_f: int, sizes: dict[str, int], seed: int) -> LoRAAdapter:
    g = torch.Generator().manual_seed(seed)
    weights = {(0, p): (torch.randn(in_f, rank, generator=g), torch.randn(rank, n, generator=g))
               for p, n in sizes.items()}
    return LoRAAdapter(name=name, path="-", rank=rank, weights=weights)


def test_mixed_rows_get_their_own_adapters_delta() -> None:
    in_f, sizes = 12, {"q_proj": 8, "k_proj": 4, "v_proj": 4}
    base = nn.Linear(in_f, 16, bias=False)
    rows = StepRows()
    lin = LoRALinear(base, [Part("q_proj", 0, 8), Part("k_proj", 8, 4), Part("v_proj", 12, 4)], in_f, rows)
    lin.allocate(n_slots=4, max_rank=6, device=torch.device("cpu"), dtype=torch.float32)
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
