"""The chunk kernel (engine/fused/chunk_attention.h): a prompt chunk's rows, each attending the prefix and the
chunk's rows up to its own, within float rounding of SDPA; a row's bits do not depend on where its prompt was cut
into chunks, on the threads, or on the rows it shares a 4-row tile with; it reads no key past its region; and the
engine's quantized layers use it for every prompt chunk, and the row kernel for every decode and verification,
whatever their row counts."""
from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from _engine_factories import every_format_runs, make_engine, tiny_hf_model, torch_threads  # noqa: F401

from engine.fused import build
from engine.fused.row_attention import HEAD_DIMS
from engine.model import Route, SeqAttention, attention_route, causal_mask_at_end
from engine.softcap_attention import softcapped_sdpa


@pytest.fixture(scope="module")
def chunk_attention() -> Any:
    built = build.load_ops("decoder_step")
    assert built.library is not None, built.why
    return torch.ops.specstream.chunk_attention


def _operands(rows: int, prefix: int, heads: int, kv_heads: int, dim: int, seed: int) -> tuple[torch.Tensor, ...]:
    """q for `rows` rows after `prefix` cached positions; k and v run 5 positions past the last row's, as NaN."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, heads, dim, generator=g)
    k, v = (torch.randn(kv_heads, prefix + rows + 5, dim, generator=g) * 2 for _ in range(2))
    k[:, prefix + rows :] = v[:, prefix + rows :] = float("nan")  # past the region: never read
    return q, k, v


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: int) -> torch.Tensor:
    """The chunk as the layers attended it before, in float64: [rows, Hq, D]."""
    rows = q.shape[0]
    n = prefix + rows
    mask = torch.ones(rows, n, dtype=torch.bool).tril(prefix)
    out = F.scaled_dot_product_attention(q.transpose(0, 1).double(), k[:, :n].double(), v[:, :n].double(),
                                         attn_mask=mask, enable_gqa=True)  # fmt: skip
    return out.transpose(0, 1).float()


@pytest.mark.parametrize("dim", HEAD_DIMS)
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (9, 3), (7, 1)])
def test_each_row_is_within_float_rounding_of_sdpa(chunk_attention: Any, dim: int, heads: int, kv_heads: int) -> None:
    for rows, prefix in [(1, 0), (2, 0), (3, 5), (4, 12), (5, 16), (9, 0), (17, 31), (33, 0), (40, 200)]:
        q, k, v = _operands(rows, prefix, heads, kv_heads, dim, seed=rows * 1000 + prefix)
        torch.testing.assert_close(chunk_attention(q, k, v, prefix + 1), _sdpa(q, k, v, prefix), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dim", HEAD_DIMS)
def test_soft_capped_scores_are_within_float_rounding_of_the_eager_cap_in_float64(
        chunk_attention: Any, dim: int) -> None:
    # Gemma 2's attn_logit_softcapping: scores -> cap * tanh(scores / cap) before the mask and the softmax.
    for rows, prefix in [(1, 0), (5, 16), (17, 31), (40, 200)]:
        q, k, v = _operands(rows, prefix, 9, 3, dim, seed=rows + prefix)
        n = prefix + rows
        mask = torch.ones(rows, n, dtype=torch.bool).tril(prefix)
        want = softcapped_sdpa(q.transpose(0, 1).double(), k[:, :n].double(), v[:, :n].double(), attn_mask=mask,
                               softcap=2.0).transpose(0, 1).float()  # fmt: skip
        got = chunk_attention(q, k, v, prefix + 1, softcap=2.0)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert rows == 1 and prefix == 0 or not torch.allclose(got, chunk_attention(q, k, v, prefix + 1))  # it bites


@pytest.mark.parametrize("dim", HEAD_DIMS)
def test_a_rows_bits_do_not_depend_on_where_the_prompt_was_cut(chunk_attention: Any, dim: int) -> None:
    rows = 70
    q, k, v = _operands(rows, 0, 9, 3, dim, seed=dim)
    whole = chunk_attention(q, k, v, 1)
    for cuts in ([1], [3, 4], [16, 17, 35], [5, 22, 23, 24, 61], [69]):
        starts = [0, *cuts]
        ends = [*cuts, rows]
        pieces = [chunk_attention(q[a:b].contiguous(), k, v, a + 1) for a, b in zip(starts, ends)]
        assert torch.equal(torch.cat(pieces), whole), (dim, cuts)


@pytest.mark.parametrize("dim", HEAD_DIMS)
def test_a_bfloat16_region_gets_exactly_what_its_fp32_widening_gets(chunk_attention: Any, dim: int) -> None:
    for rows, prefix in [(1, 0), (5, 16), (33, 0), (40, 200)]:
        q, k, v = _operands(rows, prefix, 9, 3, dim, seed=rows + prefix)
        kb, vb = k.bfloat16(), v.bfloat16()
        widened = chunk_attention(q, kb.float(), vb.float(), prefix + 1)
        assert torch.equal(chunk_attention(q, kb, vb, prefix + 1), widened), (dim, rows, prefix)


def test_threads_share_out_the_tiles_without_changing_a_bit(chunk_attention: Any) -> None:
    for rows, prefix in [(3, 2), (150, 300)]:  # one thread below the parallel threshold, tiles shared out above it
        q, k, v = _operands(rows, prefix, 9, 3, 64, seed=rows)
        outs = []
        for threads in (1, 2, 3):
            with torch_threads(threads):
                outs.append(chunk_attention(q, k, v, prefix + 1))
        assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_rows_read_from_a_view_of_the_qkv_rows_and_an_arena_region(chunk_attention: Any) -> None:
    qk = torch.randn(30, 9 + 3, 64)
    arena = torch.randn(2, 3, 200, 64)
    got = chunk_attention(qk[2:27, :9], arena[0, :, 50:100], arena[1, :, 50:100], 26)
    want = chunk_attention(qk[2:27, :9].contiguous(), arena[0, :, 50:100].contiguous(),
                           arena[1, :, 50:100].contiguous(), 26)  # fmt: skip
    assert torch.equal(got, want)


def test_operands_it_cannot_attend_are_refused_naming_the_problem(chunk_attention: Any) -> None:
    q, k, v = _operands(4, 10, 9, 3, 64, seed=0)
    with pytest.raises(RuntimeError, match="chunk_attention: the region is too short"):
        chunk_attention(q, k, v, 20)
    with pytest.raises(RuntimeError, match="chunk_attention: q fp32, k and v both fp32 or both bfloat16"):
        chunk_attention(q.double(), k, v, 3)
    with pytest.raises(RuntimeError, match="chunk_attention: q fp32, k and v both fp32 or both bfloat16"):
        chunk_attention(q, k, v.bfloat16(), 3)


@pytest.mark.usefixtures("every_format_runs")  # int4 itself, not fp32 under its name
def test_the_engine_installs_it_with_the_row_kernel_on_quantized_layers_and_says_so() -> None:
    # (test_fused_decoder_step checks, bit for bit, that the fused step attends prompt chunks as the layers do.)
    lines: list[str] = []
    engine = make_engine(tiny_hf_model("llama"), weights="int4", progress=lines.append)
    assert all(layer.self_attn.chunk_attention is not None for layer in engine.model.layers)
    assert any("prompt chunks in another (engine/fused/chunk_attention.h)" in line for line in lines)
    fp32 = make_engine(tiny_hf_model("llama"), weights="fp32")
    assert all(layer.self_attn.chunk_attention is None for layer in fp32.model.layers)


@pytest.mark.parametrize("rows", [1, 5, 9, 12, 600])
def test_with_the_kernels_a_sequences_rows_attend_by_what_they_are_not_by_their_count(rows: int) -> None:
    mask = causal_mask_at_end(rows, 20 + rows, "cpu") if rows > 1 else None
    chunk = SeqAttention(0, rows, 0, 20 + rows, mask, prompt=True)
    verification = SeqAttention(0, rows, 0, 20 + rows, mask)
    assert attention_route(chunk, rows_as_decodes=9, kernels=True) == Route.CHUNK_KERNEL
    assert attention_route(verification, rows_as_decodes=9, kernels=True) == Route.ROW_KERNEL
    # Without them (fp32, a head size without a kernel): SDPA, row by row for verifications of up to 9 rows.
    row_by_row = rows > 1 and rows <= 9
    assert attention_route(verification, 9, kernels=False) == (Route.SDPA_ROWS if row_by_row else Route.SDPA)
    assert attention_route(chunk, 0, kernels=False) == Route.SDPA
