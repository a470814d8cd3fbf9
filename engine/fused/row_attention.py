"""The C++ row kernel (row_attention.h) for the attention of decode-like rows: a decode's row and a
verification step's rows.

Layers that attend verification rows as decodes (Attention.rows_as_decodes, the bf16-activation formats)
used to make one SDPA call per row, so that each row rounds as its decode does: a verification of k drafts
paid k + 1 calls a layer. The kernel takes all of a sequence's rows in one call, reads K and V once for all
of them, and gives each row the same bits whatever the row count. The eager layers and the fused step both
use it, so they stay bit for bit equal, and a verification row still equals its decode.

Installed with it, the chunk kernel (chunk_attention.h) takes a prompt chunk's rows in place of SDPA: half of
SDPA's work on a causal chunk (which computes the masked half of its square too), and each row's bits do not
depend on where the prompt was cut into chunks.
"""
from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import torch

from engine.fused.build import load_ops

if TYPE_CHECKING:
    from engine.model import Decoder

HEAD_DIMS = (16, 32, 64, 128, 256)  # the head sizes row_attention.h is instantiated for (256: Gemma 3's)


def install_row_attention(model: Decoder) -> str:
    """Give each layer that attends verification rows as decodes the row kernel; returns what was done or why
    not (those layers then keep SDPA row by row)."""
    attentions = [layer.self_attn for layer in model.layers if layer.self_attn.rows_as_decodes > 0]
    if not attentions:
        return "row attention: no layer attends verification rows as decodes"
    if model.device.type != "cpu" or model.dtype != torch.float32:
        return f"row attention: SDPA row by row (the kernel knows fp32 on CPU, not {model.dtype} on {model.device.type})"
    if model.cfg.attn_scale is not None and model.cfg.attn_scale != model.cfg.head_dim**-0.5:
        return "row attention: SDPA row by row (the kernel scales by 1 / sqrt(head_dim), the model otherwise)"
    if model.cfg.head_dim not in HEAD_DIMS:
        return f"row attention: SDPA row by row (no kernel for head size {model.cfg.head_dim})"
    built = load_ops("decoder_step")
    if built.library is None:
        return f"row attention: SDPA row by row ({built.why})"
    cap = model.cfg.attn_softcap  # Gemma 2's: the kernels cap the scores as engine.softcap_attention does
    for attention in attentions:
        attention.row_attention = partial(torch.ops.specstream.row_attention, softcap=cap or 0.0)
        attention.chunk_attention = partial(torch.ops.specstream.chunk_attention, softcap=cap or 0.0)
    return ("row attention: decodes and verification rows in one C++ call per sequence and layer, prompt chunks "
            "in another (engine/fused/chunk_attention.h)")
