"""GGUF's own quantized tensors carried into our QuantizedTensor, without a float round trip.

Block layouts (ggml; `d`, `m`, `dmin` fp16; weights in order along in_features):
    Q4_0  32: [d][16 bytes: q_j in the low nibble of byte j, q_{j+16} in the high]   w = d * (q - 8)
    Q4_1  32: [d][m][16 bytes, same nibbles]                                        w = d * q + m
    Q5_0  32: [d][qh: bit j is q_j's fifth][16 bytes, same nibbles]                 w = d * (q - 16)
    Q5_1  32: [d][m][qh][16 bytes]                                                  w = d * q + m
    Q8_0  32: [d][32 x int8]                                                        w = d * q
    Q4_K 256: [d][dmin][12 bytes: eight 6-bit scales sc and mins mn][128 bytes: sub-block 2i in the low
              nibbles of bytes 32i.., 2i + 1 in the high]                           w = d * sc * q - dmin * mn
    Q5_K 256: as Q4_K, with [32 bytes qh: bit i of byte l is the fifth bit of sub-block i's q_l] before the nibbles
    Q6_K 256: [128 bytes low nibbles][64 bytes high 2-bit pairs][16 x int8 sc][d]  w = d * sc * (q - 32), sc per 16
Each maps onto our formats with the SAME codes and its scales and mins exact in fp32 (engine/quant/tensor.py's
w = q * scale + min is GGUF's own): Q4_0/Q4_1/Q4_K -> int4 in groups of 32; Q5_0/Q8_0 -> int8 codes (q - 16, q)
with a scale per 32; Q5_1/Q5_K -> int8 codes 0..31 with a scale and a min per 32; Q6_K -> int8 codes q - 32 with
a scale per 16. The `gguf` weight format serves every tensor so (NATIVE_TYPES); int4/int8 quantize what does not map
(dequantized with the gguf package, quantized once).

llama.cpp's converter permutes the q/k rows of llama-family models for its rotary layout; transformers undoes it
on load, and so do we, on the codes.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from engine.model import DecoderConfig
from engine.quant.gguf_tensors import GGUFTensor, read_tensors
from engine.quant.source import NATIVE_TYPES
from engine.quant.tensor import INT4_GROUP, QuantFormat, QuantizedTensor, quantize

# Architectures whose GGUF q/k rows llama.cpp permuted (transformers' TensorProcessor for llama).
_PERMUTED_QK = ("llama", "mistral")
# engine.weights: a quantized format, or "gguf" (every tensor as its file's type holds it).
TargetFormat = QuantFormat | Literal["gguf"]
# The types int4 and int8 keep as they are (the rest they quantize once).
_KEPT = {"int4": ("Q4_0", "Q4_1"), "int8": ("Q8_0",)}


def _blocks(raw: np.ndarray, block_bytes: int) -> np.ndarray:
    """[out, bytes per row] uint8 -> [out, blocks, block_bytes]."""
    out = raw.shape[0]
    return raw.reshape(out, -1, block_bytes)


def _fp16(blocks: np.ndarray, offset: int) -> torch.Tensor:
    """The fp16 field at `offset` of every block, as fp32 [out, blocks] (exact: fp16 embeds in fp32)."""
    field = np.ascontiguousarray(blocks[..., offset : offset + 2]).view(np.float16)[..., 0]
    return torch.from_numpy(field.astype(np.float32))


def _low_high(qs: np.ndarray) -> np.ndarray:
    """Packed bytes [..., n] -> [..., 2, n]: their low nibbles, then their high ones."""
    return np.stack([qs & 0x0F, qs >> 4], axis=-2)


def _nibbles(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The 16 packed bytes at `offset` -> uint8 codes [out, blocks, 32] in weight order (low nibbles first)."""
    return _low_high(blocks[..., offset : offset + 16]).reshape(*blocks.shape[:2], 32)


def _fifth_bits(blocks: np.ndarray, offset: int) -> np.ndarray:
    """Q5_0/Q5_1's qh (a little-endian uint32) at `offset` -> [out, blocks, 32] bits shifted to 16."""
    bits = np.unpackbits(np.ascontiguousarray(blocks[..., offset : offset + 4]), axis=-1, bitorder="little")
    return bits << 4


def _rows(codes: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """[out, blocks, ...] codes -> [out, in] of dtype."""
    return torch.from_numpy(np.ascontiguousarray(codes.reshape(codes.shape[0], -1))).to(dtype)


def repack_q4(raw: np.ndarray, has_min: bool) -> QuantizedTensor:
    """A Q4_0 (has_min False) or Q4_1 tensor's bytes [out, bytes per row] as int4 codes, bit for bit."""
    blocks = _blocks(raw, 20 if has_min else 18)
    d = _fp16(blocks, 0)  # [out, blocks]
    mins = _fp16(blocks, 2) if has_min else -8 * d  # exact: d * (q - 8) == d * q - 8d
    return QuantizedTensor("int4", _rows(_nibbles(blocks, 4 if has_min else 2), torch.uint8), d, mins, INT4_GROUP)


def repack_q5(raw: np.ndarray, has_min: bool) -> QuantizedTensor:
    """A Q5_0 (codes q - 16, symmetric) or Q5_1 (codes q with mins) tensor as int8 with a scale per 32."""
    blocks = _blocks(raw, 24 if has_min else 22)
    qh, qs = (4, 8) if has_min else (2, 6)
    q = _nibbles(blocks, qs) | _fifth_bits(blocks, qh)  # [out, blocks, 32] in 0..31
    codes = _rows(q.astype(np.int8) - (0 if has_min else 16), torch.int8)
    return QuantizedTensor("int8", codes, _fp16(blocks, 0), _fp16(blocks, 2) if has_min else None, INT4_GROUP)


def repack_q8_0(raw: np.ndarray) -> QuantizedTensor:
    """A Q8_0 tensor's bytes [out, bytes per row] as int8 codes with a scale per block, bit for bit."""
    blocks = _blocks(raw, 34)
    codes = torch.from_numpy(np.ascontiguousarray(blocks[..., 2:]).view(np.int8))  # [out, blocks, 32]
    return QuantizedTensor("int8", codes.reshape(raw.shape[0], -1), _fp16(blocks, 0), None, INT4_GROUP)


def _k_scales_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes [..., 12] -> the eight 6-bit scales and mins [..., 8]: bytes 0-3 hold scales 0-3 (low 6
    bits) and the top 2 bits of scales 4-7, bytes 4-7 the same for the mins, bytes 8-11 the low 4 bits of scales 4-7
    (low nibble) and of mins 4-7 (high nibble)."""
    sc_lo, mn_lo, rest = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    scales = np.concatenate([sc_lo & 0x3F, (rest & 0x0F) | ((sc_lo >> 6) << 4)], axis=-1)
    mins = np.concatenate([mn_lo & 0x3F, (rest >> 4) | ((mn_lo >> 6) << 4)], axis=-1)
    return scales, mins


def repack_k(raw: np.ndarray, bits: int) -> QuantizedTensor:
    """A Q4_K (bits 4: int4) or Q5_K (bits 5: int8 codes 0..31) tensor: a scale and a min per 32 weights."""
    blocks = _blocks(raw, 144 if bits == 4 else 176)
    out, n = blocks.shape[:2]
    sc, mn = _k_scales_mins(blocks[..., 4:16])  # [out, n, 8]
    # d * sc and dmin * mn: fp16 times a 6-bit integer, exact in fp32 (the file's own sub-block scale and min).
    scales = (_fp16(blocks, 0)[..., None] * torch.from_numpy(sc.astype(np.float32))).reshape(out, -1)
    mins = (-_fp16(blocks, 2)[..., None] * torch.from_numpy(mn.astype(np.float32))).reshape(out, -1)
    low = blocks[..., -128:].reshape(out, n, 4, 32)  # sub-blocks 2i (low nibbles) and 2i + 1 (high) in row i
    q = _low_high(low).reshape(out, n, 8, 32)  # [out, n, sub-block, 32]
    if bits == 4:
        return QuantizedTensor("int4", _rows(q, torch.uint8), scales, mins, INT4_GROUP)
    qh = blocks[..., 16:48]  # [out, n, 32]: bit i of byte l belongs to sub-block i's weight l
    fifth = (qh[:, :, None, :] >> np.arange(8, dtype=np.uint8)[None, None, :, None]) & 1  # [out, n, 8, 32]
    return QuantizedTensor("int8", _rows((q | (fifth << 4)).astype(np.int8), torch.int8), scales, mins, INT4_GROUP)


def repack_q6_k(raw: np.ndarray) -> QuantizedTensor:
    """A Q6_K tensor as int8 codes q - 32 with a scale per 16 weights (d * sc: fp16 times int8, exact in fp32)."""
    blocks = _blocks(raw, 210)
    out, n = blocks.shape[:2]
    # Each half of 128 weights: 64 bytes of nibbles (weights 0..63 low, 64..127 high) and 32 bytes whose 2-bit pair
    # p holds the top bits of weights 32p + l.
    low = _low_high(blocks[..., :128].reshape(out, n, 2, 64)).reshape(out, n, 2, 128)
    pairs = blocks[..., 128:192].reshape(out, n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]
    high = (pairs & 3).reshape(out, n, 2, 128)
    codes = _rows((low | (high << 4)).astype(np.int8) - 32, torch.int8)
    sc = torch.from_numpy(np.ascontiguousarray(blocks[..., 192:208]).view(np.int8).astype(np.float32))  # [out, n, 16]
    scales = (_fp16(blocks, 208)[..., None] * sc).reshape(out, -1)
    return QuantizedTensor("int8", codes, scales, None, 16)


@functools.cache
def _native_repacks() -> dict[object, Callable[[np.ndarray], QuantizedTensor]]:
    """Per GGUF type the gguf format serves (engine.quant.source.NATIVE_TYPES, which a test holds equal to these),
    its repack."""
    from gguf import GGMLQuantizationType as Q

    return {
        Q.Q4_0: lambda raw: repack_q4(raw, has_min=False),
        Q.Q4_1: lambda raw: repack_q4(raw, has_min=True),
        Q.Q5_0: lambda raw: repack_q5(raw, has_min=False),
        Q.Q5_1: lambda raw: repack_q5(raw, has_min=True),
        Q.Q8_0: repack_q8_0,
        Q.Q4_K: lambda raw: repack_k(raw, 4),
        Q.Q5_K: lambda raw: repack_k(raw, 5),
        Q.Q6_K: repack_q6_k,
    }


def gguf_tensor(tensor: GGUFTensor, fmt: TargetFormat) -> QuantizedTensor:
    """One GGUF tensor (engine.quant.gguf_tensors) as `fmt`: repacked where `fmt` holds its type as it is (`gguf`:
    every type in NATIVE_TYPES, which engine.quant.source checked before loading), else quantized once."""
    from gguf.quants import dequantize

    kind = tensor.tensor_type
    raw = np.asarray(tensor.data)
    repack = _native_repacks().get(kind)
    if repack is not None and (fmt == "gguf" or kind.name in _KEPT.get(fmt, ())):
        return repack(raw)
    if fmt == "gguf":
        raise ValueError(f"engine.weights gguf: {tensor.name} is {kind.name}, which is not served as it is "
                         f"(served: {', '.join(sorted(NATIVE_TYPES))})")
    dense = torch.from_numpy(np.ascontiguousarray(dequantize(raw, kind)).astype(np.float32))  # [out, in]
    return quantize(dense, fmt)  # type: ignore[arg-type]


def _unpermute_rows(qt: QuantizedTensor, n_head: int) -> QuantizedTensor:
    """Undo llama.cpp's q/k row permutation (transformers' reverse_permute_weights) on the codes."""
    out = qt.shape[0]
    # HF: w.reshape(n_head, dim, 2, in).swapaxes(1, 2): our row (h, a, j) is GGUF row (h, j, a).
    index = torch.arange(out).reshape(n_head, out // n_head // 2, 2).transpose(1, 2).reshape(out)
    return qt.rows(index)


def read_gguf_weights(
    path: Path, cfg: DecoderConfig, fmt: TargetFormat, head_fmt: TargetFormat
) -> dict[str, QuantizedTensor]:
    """Our fused linears (and the embedding / LM head) from a GGUF, keyed by module path in the Decoder.

    head_fmt is used for the token embedding and the LM head (tied or not).
    """
    tensors = {t.name: t for t in read_tensors(path)}

    def get(name: str, as_fmt: TargetFormat = fmt) -> QuantizedTensor:
        if name not in tensors:
            raise KeyError(f"{path.name} has no tensor {name!r}")
        return gguf_tensor(tensors[name], as_fmt)

    permute = cfg.model_type in _PERMUTED_QK
    out: dict[str, QuantizedTensor] = {"embed_tokens": get("token_embd.weight", head_fmt)}
    if not cfg.tie_word_embeddings:
        out["lm_head"] = get("output.weight", head_fmt)
    for i in range(cfg.num_layers):
        b = f"blk.{i}."
        q, k = get(b + "attn_q.weight"), get(b + "attn_k.weight")
        if permute:
            q, k = _unpermute_rows(q, cfg.num_heads), _unpermute_rows(k, cfg.num_kv_heads)
        p = f"layers.{i}."
        out[p + "self_attn.qkv_proj"] = QuantizedTensor.cat([q, k, get(b + "attn_v.weight")])
        out[p + "self_attn.o_proj"] = get(b + "attn_output.weight")
        out[p + "mlp.gate_up_proj"] = QuantizedTensor.cat([get(b + "ffn_gate.weight"), get(b + "ffn_up.weight")])
        out[p + "mlp.down_proj"] = get(b + "ffn_down.weight")
    return out
