"""GGUF repacking: Q4_0 / Q4_1 blocks become int4 codes and Q8_0 blocks int8 codes with a scale a block, bit for
bit (re-encoding them gives the file's bytes back); K-quants, Q5_0/Q5_1 and Q6_K keep their codes with exact scales;
every type means, bit for bit, the weights the gguf package dequantizes it to; mixed types fuse without rounding; and
the q/k rows come out in the order transformers gives them."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

from engine.quant.gguf_repack import _native_repacks, _unpermute_rows, gguf_tensor, repack_q4, repack_q8_0
from engine.quant.gguf_tensors import GGUFTensor
from engine.quant.source import NATIVE_TYPES
from engine.quant.tensor import QuantizedTensor
from engine.quant.tensor import quantize as quantize_once


def _encode(qt: QuantizedTensor, has_min: bool) -> np.ndarray:
    """Our int4 codes back into ggml Q4_0 / Q4_1 bytes [out, blocks * block bytes]."""
    assert qt.mins is not None
    out = qt.shape[0]
    d = qt.scales.numpy().astype(np.float16)  # [out, blocks]; exact: the scales came from fp16
    codes = qt.codes.view(out, -1, 32).numpy()  # [out, blocks, 32]
    qs = (codes[..., :16] | (codes[..., 16:] << 4)).astype(np.uint8)  # [out, blocks, 16]
    fields = [d[..., None].view(np.uint8).reshape(out, -1, 2)]
    if has_min:
        m = qt.mins.numpy().astype(np.float16)
        fields.append(m[..., None].view(np.uint8).reshape(out, -1, 2))
    return np.concatenate([*fields, qs], axis=-1).reshape(out, -1)


@pytest.mark.parametrize("kind", [Q.Q4_0, Q.Q4_1])
def test_q4_blocks_repack_into_int4_codes_and_back_to_the_same_bytes(kind: Q) -> None:
    rng = np.random.default_rng(0)
    raw = quantize(rng.standard_normal((48, 256)).astype(np.float32), kind)  # [48, bytes per row]
    qt = repack_q4(raw, has_min=kind == Q.Q4_1)
    assert qt.fmt == "int4" and qt.group_size == 32 and qt.shape == (48, 256)
    assert np.array_equal(_encode(qt, has_min=kind == Q.Q4_1), raw)


@pytest.mark.parametrize("kind", [Q.Q4_0, Q.Q4_1])
def test_repacked_codes_mean_the_weights_gguf_dequantizes_to(kind: Q) -> None:
    rng = np.random.default_rng(1)
    raw = quantize(rng.standard_normal((16, 128)).astype(np.float32), kind)
    ours = repack_q4(raw, has_min=kind == Q.Q4_1).dequantize()
    theirs = torch.from_numpy(dequantize(raw, kind).astype(np.float32))
    assert torch.equal(ours, theirs)  # q * d + m, GGUF's own convention: the same fp32 operations


def test_q8_0_blocks_stay_int8_blocks_meaning_exactly_what_gguf_dequantizes_to() -> None:
    rng = np.random.default_rng(5)
    raw = quantize(rng.standard_normal((40, 192)).astype(np.float32), Q.Q8_0)  # [40, 6 blocks * 34 bytes]
    qt = repack_q8_0(raw)
    assert qt.fmt == "int8" and qt.blocked and qt.group_size == 32 and qt.scales.shape == (40, 6)
    d = qt.scales.numpy().astype(np.float16).view(np.uint8).reshape(40, 6, 2)  # exact: the scales came from fp16
    again = np.concatenate([d, qt.codes.view(40, 6, 32).numpy().view(np.uint8)], axis=-1).reshape(40, -1)
    assert np.array_equal(again, raw)
    assert torch.equal(qt.dequantize(), torch.from_numpy(dequantize(raw, Q.Q8_0).astype(np.float32)))
    assert torch.equal(qt.rows(torch.tensor([3, 0])).dequantize(), qt.dequantize()[[3, 0]])


def test_q8_0_blocks_fused_beside_per_row_int8_are_quantized_per_row_like_them() -> None:
    rng = np.random.default_rng(6)
    q8 = repack_q8_0(quantize(rng.standard_normal((16, 64)).astype(np.float32), Q.Q8_0))
    rows = quantize_once(torch.from_numpy(rng.standard_normal((8, 64)).astype(np.float32)), "int8")
    fused = QuantizedTensor.cat([q8, rows])  # e.g. a Q8_0 attn_q beside a Q6_K attn_v, in int8
    assert not fused.blocked and fused.shape == (24, 64)
    torch.testing.assert_close(fused.dequantize()[:16], q8.dequantize(), rtol=0, atol=float(q8.scales.max()))
    assert QuantizedTensor.cat([q8, q8]).blocked  # blocks beside blocks stay blocks


@pytest.mark.parametrize(("n_head", "n_kv"), [(9, 9), (9, 3)])
def test_qk_rows_are_unpermuted_like_transformers_does_for_llama(n_head: int, n_kv: int) -> None:
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    rows = n_kv * 64  # the k projection of a head_dim-64 model
    raw = quantize(np.random.default_rng(2).standard_normal((rows, 64)).astype(np.float32), Q.Q4_1)
    dense = dequantize(raw, Q.Q4_1)
    processor = LlamaTensorProcessor(config={"num_attention_heads": n_head, "num_key_value_heads": n_kv})
    expected = processor.process(dense, "blk.0.attn_k.weight").weights
    ours = _unpermute_rows(repack_q4(raw, has_min=True), n_kv).dequantize()
    torch.testing.assert_close(ours, torch.from_numpy(np.ascontiguousarray(expected)), rtol=0, atol=1e-6)


# Where each type keeps its fp16 fields (the rest of a block is codes and packed integer scales: any bytes are valid).
_FP16_FIELDS = {Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}


def _random_blocks(kind: Q, rows: int, inputs: int, seed: int) -> np.ndarray:
    """[rows, bytes per row] of random blocks of `kind` with finite fp16 scales (gguf cannot write K-quants)."""
    from gguf.constants import GGML_QUANT_SIZES

    rng = np.random.default_rng(seed)
    block, block_bytes = GGML_QUANT_SIZES[kind]
    blocks = inputs // block
    raw = rng.integers(0, 256, (rows, blocks, block_bytes), dtype=np.uint8)
    for at in _FP16_FIELDS[kind]:
        d = rng.uniform(1e-5, 1e-2, (rows, blocks)).astype(np.float16) * rng.choice([-1, 1], (rows, blocks))
        raw[..., at : at + 2] = d.astype(np.float16)[..., None].view(np.uint8)
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("kind", list(_FP16_FIELDS), ids=lambda k: k.name)
def test_k_quants_q5_and_q6_keep_their_codes_and_mean_exactly_what_gguf_dequantizes_to(kind: Q) -> None:
    raw = _random_blocks(kind, 24, 768, seed=kind.value)
    qt = _native_repacks()[kind](raw)
    theirs = torch.from_numpy(dequantize(raw, kind).astype(np.float32))
    assert qt.shape == theirs.shape and torch.equal(qt.dequantize(), theirs)
    assert qt.fmt == ("int4" if kind == Q.Q4_K else "int8") and qt.group_size == (16 if kind == Q.Q6_K else 32)
    spans = {Q.Q4_K: (0, 15), Q.Q5_0: (-16, 15), Q.Q5_1: (0, 31), Q.Q5_K: (0, 31), Q.Q6_K: (-32, 31)}[kind]
    assert spans[0] <= int(qt.codes.min()) and int(qt.codes.max()) <= spans[1]  # the file's codes, not requantized


def test_the_gguf_format_serves_exactly_the_types_the_source_check_names() -> None:
    assert {kind.name for kind in _native_repacks()} == NATIVE_TYPES
    q3 = GGUFTensor("blk.0.attn_q.weight", Q.Q3_K, (256, 4), np.zeros((4, 110), dtype=np.uint8))
    with pytest.raises(ValueError, match="blk.0.attn_q.weight is Q3_K, which is not served as it is"):
        gguf_tensor(q3, "gguf")


@pytest.mark.parametrize(
    "kinds", [(Q.Q4_K, Q.Q4_K, Q.Q6_K), (Q.Q5_0, Q.Q5_0, Q.Q8_0), (Q.Q4_K, Q.Q5_0), (Q.Q5_K, Q.Q6_K), (Q.Q4_0, Q.Q6_K)],
    ids=lambda kinds: "+".join(k.name for k in kinds),
)
def test_mixed_types_fuse_into_one_kind_without_rounding(kinds: tuple[Q, ...]) -> None:
    raws = [_random_blocks(k, 16, 512, seed=i) if k in _FP16_FIELDS
            else quantize(np.random.default_rng(i).standard_normal((16, 512)).astype(np.float32), k)
            for i, k in enumerate(kinds)]
    parts = [_native_repacks()[k](raw) for k, raw in zip(kinds, raws, strict=True)]
    fused = QuantizedTensor.cat(parts)
    theirs = torch.cat([torch.from_numpy(dequantize(raw, k).astype(np.float32)) for k, raw in zip(kinds, raws)])
    assert torch.equal(fused.dequantize(), theirs)
    assert fused.blocked and fused.group_size == min(p.group_size for p in parts)
