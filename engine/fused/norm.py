"""RMSNorm as one C++ loop (engine/fused/step_ops.h) for the layers that the fused step runs.

At batch 1 ATen's rms_norm of one 576-float row is ~7 ops and ~24 us on the dev machine; a
step has 61 of them (1.5 ms of an 8.4 ms int4 step, bench/step_profile.py). The loop takes
under a microsecond. It sums the squares in its own fixed order, so its bits differ from
ATen's in the last place: the fused step and the eager layers must both use it or neither,
and this installs it in the layers exactly where the fused step will read it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine.fused.build import load_ops

if TYPE_CHECKING:
    from engine.model import Decoder


def install_norm_kernel(model: Decoder) -> str:
    """Give every RMSNorm of the decoder the C++ loop; returns what was done or why not."""
    if model.device.type != "cpu" or model.dtype != torch.float32:
        return f"norms: ATen's (the loop knows fp32 on CPU, not {model.dtype} on {model.device.type})"
    built = load_ops("decoder_step")
    if built.library is None:
        return f"norms: ATen's ({built.why})"
    from engine.model import RMSNorm

    if model.cfg.norm_offset:  # RMSNorm._offset_norm: the loop scales by w, not (offset + w)
        return f"norms: ATen's ({model.cfg.model_type}'s norms scale by ({model.cfg.norm_offset:g} + w))"
    for m in model.modules():
        if isinstance(m, RMSNorm):
            m.kernel = torch.ops.specstream.rms_norm
    return "norms: one C++ loop per row (engine/fused/step_ops.h)"
