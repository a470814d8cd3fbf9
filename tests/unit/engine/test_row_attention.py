"""The row kernel (engine/fused/row_attention.h): a decode's row and a verification step's rows attended in one
call, each row within float rounding of SDPA and bit for bit what the same row gets alone (its decode), for every
head size it is built for and key counts on both sides of its 16-position blocks and 64-position spans; installed on the layers that
attend verification rows as decodes, and refused with the reason elsewhere."""
from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from _engine_factories import every_format_runs, make_engine, tiny_hf_model, torch_threads  # noqa: F401

from engine.fused import build
from engine.fused.row_attention import HEAD_DIMS, install_row_attention
from engine.softcap_attention import softcapped_sdpa

LENGTHS = [*range(1, 35), 47, 48, 49, 60, 63, 64, 65, 127, 128, 129, 450]


@pytest.fixture(scope="module")
def row_attention() -> Any:
    built = build.load_ops("decoder_step")
    assert built.library is not None, built.why
    return torch.ops.specstream.row_attention


def _operands(rows: int, first_len: int, heads: int, kv_heads: int, dim: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    n = first_len + rows - 1 + 3  # the region runs past the last row's keys: they must not be read
    q = torch.randn(rows, heads, dim, generator=g)
    k, v = (torch.randn(kv_heads, n, dim, generator=g) * 2 for _ in range(2))
    return q, k, v


def _sdpa_row(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, length: int) -> torch.Tensor:
    """One decode's attention over the first `length` keys, as the layers ran it before: [1, Hq, D]."""
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k[:, :length], v[:, :length], enable_gqa=True)
    return out.transpose(0, 1)


def _rows_near_and_their_decodes_bits(row_attention: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                      first_len: int, want: Callable[[int, int], torch.Tensor],
                                      **kw: float) -> torch.Tensor:
    """All of q's rows in one call: row r within float rounding of want(r, its key count), and bit for bit what the
    row gets alone (its decode). Returns the call's output."""
    together = row_attention(q, k, v, first_len, **kw)
    for r in range(q.shape[0]):
        torch.testing.assert_close(together[r : r + 1], want(r, first_len + r), rtol=1e-5, atol=1e-5)
        assert torch.equal(together[r : r + 1], row_attention(q[r : r + 1], k, v, first_len + r, **kw)), r
    return together


@pytest.mark.parametrize("dim", HEAD_DIMS)
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (9, 3)])
def test_each_row_is_within_float_rounding_of_sdpa(row_attention: Any, dim: int, heads: int, kv_heads: int) -> None:
    for first_len in LENGTHS:
        q, k, v = _operands(5, first_len, heads, kv_heads, dim, seed=first_len)
        out = row_attention(q, k, v, first_len)
        for r in range(5):
            torch.testing.assert_close(out[r : r + 1], _sdpa_row(q[r : r + 1], k, v, first_len + r), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dim", HEAD_DIMS)
def test_a_verification_row_gets_exactly_the_bits_of_its_decode(row_attention: Any, dim: int) -> None:
    for first_len in LENGTHS:
        for rows in (2, 5, 9):
            q, k, v = _operands(rows, first_len, 9, 3, dim, seed=rows * 1000 + first_len)
            together = row_attention(q, k, v, first_len)
            for r in range(rows):
                alone = row_attention(q[r : r + 1], k, v, first_len + r)
                assert torch.equal(together[r : r + 1], alone), (dim, first_len, rows, r)


@pytest.mark.parametrize("dim", HEAD_DIMS)
def test_soft_capped_scores_are_within_float_rounding_of_the_eager_cap_and_rows_keep_their_decodes_bits(
    row_attention: Any, dim: int
) -> None:
    # Gemma 2's attn_logit_softcapping: scores -> cap * tanh(scores / cap) before the softmax.
    for first_len in (1, 17, 64, 65, 450):
        q, k, v = _operands(5, first_len, 9, 3, dim, seed=first_len)

        def capped(r: int, n: int) -> torch.Tensor:
            return softcapped_sdpa(q[r : r + 1].transpose(0, 1), k[:, :n], v[:, :n], softcap=2.0).transpose(0, 1)

        together = _rows_near_and_their_decodes_bits(row_attention, q, k, v, first_len, capped, softcap=2.0)
        assert not torch.allclose(together, row_attention(q, k, v, first_len))  # the cap bites


@pytest.mark.parametrize("heads,kv_heads", [(8, 1), (7, 1), (6, 2), (9, 3)])
def test_a_heads_bits_do_not_depend_on_the_heads_it_is_attended_with(
    row_attention: Any, heads: int, kv_heads: int
) -> None:
    # The kernel adds up the values of up to 4 heads of a row in one pass (2 at head size 128): a head alone must
    # get what it gets beside the others of its group.
    group = heads // kv_heads
    for dim, dtype in itertools.product(HEAD_DIMS, (torch.float32, torch.bfloat16)):  # either arena element
        for first_len in (5, 16, 450):
            q, k, v = _operands(3, first_len, heads, kv_heads, dim, seed=first_len + heads)
            k, v = k.to(dtype), v.to(dtype)
            together = row_attention(q, k, v, first_len)
            for h in range(heads):
                g = h // group
                alone = row_attention(q[:, h : h + 1].contiguous(), k[g : g + 1], v[g : g + 1], first_len)
                assert torch.equal(together[:, h : h + 1], alone), (dim, first_len, h)


def test_threads_share_out_the_heads_without_changing_a_bit(row_attention: Any) -> None:
    for first_len in (3, 450):  # one thread below the parallel threshold, the heads shared out above it
        q, k, v = _operands(9, first_len, 9, 3, 64, seed=first_len)
        outs = []
        for threads in (1, 2, 3):
            with torch_threads(threads):
                outs.append(row_attention(q, k, v, first_len))
        assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_rows_read_from_a_view_of_the_qkv_rows_and_an_arena_region(row_attention: Any) -> None:
    # As the layers call it: q inside the [T, Hq + Hkv, D] qk block, k and v a region in the middle of the arena.
    qk = torch.randn(6, 9 + 3, 64)
    arena = torch.randn(2, 3, 200, 64)
    got = row_attention(qk[1:4, :9], arena[0, :, 50:90], arena[1, :, 50:90], 38)
    want = row_attention(qk[1:4, :9].contiguous(), arena[0, :, 50:90].contiguous(), arena[1, :, 50:90].contiguous(), 38)
    assert torch.equal(got, want)


@pytest.mark.parametrize("dim", HEAD_DIMS)
def test_a_bfloat16_region_is_within_float_rounding_of_sdpa_on_its_widening_and_rows_keep_their_decodes_bits(
    row_attention: Any, dim: int
) -> None:
    # engine.kv_cache_dtype bfloat16: K and V are widened exactly and summed in fp32 (the dims of a score in
    # another order than from an fp32 arena), so the only rounding beyond float's is the arena's own; a verification
    # row still gets its decode's bits.
    for first_len in (1, 17, 64, 65, 450):
        q, k, v = _operands(5, first_len, 9, 3, dim, seed=first_len)
        kb, vb = k.bfloat16(), v.bfloat16()
        _rows_near_and_their_decodes_bits(row_attention, q, kb, vb, first_len,
                                          lambda r, n: _sdpa_row(q[r : r + 1], kb.float(), vb.float(), n))


@pytest.mark.parametrize(
    "args,message",
    [
        (lambda q, k, v: (q, k, v, 40), "the region is too short"),
        (lambda q, k, v: (q, k, v, 0), "the region is too short"),
        (lambda q, k, v: (q.double(), k, v, 3), "q fp32, k and v both fp32 or both bfloat16"),
        (lambda q, k, v: (q, k.bfloat16(), v, 3), "q fp32, k and v both fp32 or both bfloat16"),
        (lambda q, k, v: (q, k[:2], v[:2], 3), "head counts or sizes do not match"),
        (lambda q, k, v: (q, k.transpose(1, 2), v.transpose(1, 2), 3), "contiguous positions"),
    ],
)
def test_operands_it_cannot_attend_are_refused_naming_the_problem(row_attention: Any, args: Any, message: str) -> None:
    q, k, v = _operands(2, 30, 9, 3, 64, seed=0)
    with pytest.raises(RuntimeError, match=message):
        row_attention(*args(q, k, v))


@pytest.mark.usefixtures("every_format_runs")  # int4 itself, not fp32 under its name
def test_the_engine_installs_it_on_quantized_layers_and_says_so() -> None:
    lines: list[str] = []
    engine = make_engine(tiny_hf_model("llama"), weights="int4", progress=lines.append)
    assert all(layer.self_attn.row_attention is not None for layer in engine.model.layers)
    assert any(line.startswith("row attention: decodes and verification rows in one C++ call per sequence and layer")
               for line in lines)
    assert engine.model.fused_step is not None and engine.model.fused_step.row_kernel


@pytest.mark.usefixtures("every_format_runs")  # int4 itself, not fp32 under its name
def test_fp32_layers_and_head_sizes_without_a_kernel_keep_sdpa_with_the_reason() -> None:
    fp32 = make_engine(tiny_hf_model("llama"), weights="fp32")
    assert install_row_attention(fp32.model) == "row attention: no layer attends verification rows as decodes"
    odd = make_engine(tiny_hf_model("llama", head_dim=24), weights="int4", fused_step=False)
    assert install_row_attention(odd.model) == "row attention: SDPA row by row (no kernel for head size 24)"
    assert all(layer.self_attn.row_attention is None for layer in odd.model.layers)
