"""GGUF's own quantized tensors carried into our QuantizedTensor, without a float round trip.

Block layouts (ggml, 32 weights a block along in_features, `d`/`m` fp16):
    Q4_0  [d][16 bytes: q_j in the low nibble of byte j, q_{j+16} in the high]  w = d * (q - 8)
    Q4_1  [d][m][16 bytes, same nibbles]                                        w = d * q + m
    Q8_0  [d][32 x int8]                                                        w = d * q
Q4_0 and Q4_1 map onto the int4 convention w = (q - 8) * scale + zero with the
SAME 4-bit codes (Q4_0: zero 0; Q4_1: zero m + 8d), and Q8_0 onto int8 with a
scale per block of 32 (our kernel takes it as it is). Anything else (Q8_0 or
K-quants into int4, other formats into int8) is dequantized with the gguf
package and quantized once.

llama.cpp's converter permutes the q/k rows of llama-family models for its
rotary layout; transformers undoes it on load, and so do we, on the codes.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from engine.model import DecoderConfig
from engine.quant.gguf_tensors import GGUFTensor, read_tensors
from engine.quant.tensor import INT4_GROUP, QuantFormat, QuantizedTensor, quantize

# Architectures whose GGUF q/k rows llama.cpp permuted (transformers' TensorProcessor for llama).
_PERMUTED_QK = ("llama", "mistral")


def _blocks(raw: np.ndarray, block_bytes: int) -> np.ndarray:
    """[out, bytes per row] uint8 -> [out, blocks, block_bytes]."""
    out = raw.shape[0]
    return raw.reshape(out, -1, block_bytes)


def _fp16(blocks: np.ndarray, offset: int) -> torch.Tensor:
    """The fp16 field at `offset` of every block, as fp32 [out, blocks] (exact: fp16 embeds in fp32)."""
    field = np.ascontiguousarray(blocks[..., offset : offset + 2]).view(np.float16)[..., 0]
    return torch.from_numpy(field.astype(np.float32))


def _nibbles(blocks: np.ndarray, offset: int) -> torch.Tensor:
    """The 16 packed bytes at `offset` -> uint8 codes [out, blocks * 32] in weight order."""
    qs = torch.from_numpy(np.ascontiguousarray(blocks[..., offset : offset + 16]))  # [out, blocks, 16]
    codes = torch.cat([qs & 0x0F, qs >> 4], dim=-1)  # [out, blocks, 32]: low nibbles are weights 0..15
    return codes.reshape(qs.shape[0], -1)


def repack_q4(raw: np.ndarray, has_min: bool) -> QuantizedTensor:
    """A Q4_0 (has_min False) or Q4_1 tensor's bytes [out, bytes per row] as int4 codes, bit for bit."""
    blocks = _blocks(raw, 20 if has_min else 18)
    d = _fp16(blocks, 0)  # [out, blocks]
    if has_min:
        zeros = _fp16(blocks, 2) + 8 * d  # d * q + m == d * (q - 8) + (m + 8d)
        codes = _nibbles(blocks, 4)
    else:
        zeros = torch.zeros_like(d)
        codes = _nibbles(blocks, 2)
    return QuantizedTensor("int4", codes, d, zeros, INT4_GROUP)


def repack_q8_0(raw: np.ndarray) -> QuantizedTensor:
    """A Q8_0 tensor's bytes [out, bytes per row] as int8 codes with a scale per block, bit for bit."""
    blocks = _blocks(raw, 34)
    codes = torch.from_numpy(np.ascontiguousarray(blocks[..., 2:]).view(np.int8))  # [out, blocks, 32]
    return QuantizedTensor("int8", codes.reshape(raw.shape[0], -1), _fp16(blocks, 0), None, INT4_GROUP)


def gguf_tensor(tensor: GGUFTensor, fmt: QuantFormat) -> QuantizedTensor:
    """One GGUF tensor (engine.quant.gguf_tensors) as `fmt`: repacked when the block format maps, else quantized
    once."""
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize

    kind = tensor.tensor_type
    raw = np.asarray(tensor.data)
    if fmt == "int4" and kind in (Q.Q4_0, Q.Q4_1):
        return repack_q4(raw, has_min=kind == Q.Q4_1)
    if fmt == "int8" and kind == Q.Q8_0:
        return repack_q8_0(raw)
    dense = torch.from_numpy(np.ascontiguousarray(dequantize(raw, kind)).astype(np.float32))  # [out, in]
    return quantize(dense, fmt)


def _unpermute_rows(qt: QuantizedTensor, n_head: int) -> QuantizedTensor:
    """Undo llama.cpp's q/k row permutation (transformers' reverse_permute_weights) on the codes."""
    out = qt.shape[0]
    # HF: w.reshape(n_head, dim, 2, in).swapaxes(1, 2): our row (h, a, j) is GGUF row (h, j, a).
    index = torch.arange(out).reshape(n_head, out // n_head // 2, 2).transpose(1, 2).reshape(out)
    return qt.rows(index)


def read_gguf_weights(path: Path, cfg: DecoderConfig, fmt: QuantFormat, head_fmt: QuantFormat) -> dict[str, QuantizedTensor]:
    """Our fused linears (and the embedding / LM head) from a GGUF, keyed by module path in the Decoder.

    head_fmt is used for the token embedding and the LM head (tied or not).
    """
    tensors = {t.name: t for t in read_tensors(path)}

    def get(name: str, as_fmt: QuantFormat = fmt) -> QuantizedTensor:
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
