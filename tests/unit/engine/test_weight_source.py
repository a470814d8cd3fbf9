"""engine.weights auto keeps the model's file exactly: int4 for a GGUF of Q4_0/Q4_1 linears with a Q8_0 embedding
(its codes carried over), gguf for a GGUF of the other types our kernel serves as they are (K-quants, Q5_0, Q6_K,
Q8_0), bf16 for a bf16 checkpoint, fp32 for anything else (Q3_K, fp32 or fp16 files, linears read from floats), each
where the CPU runs it, and it says what it picked and why; gguf asked of a file it cannot serve is refused."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGUFWriter
from gguf import GGMLQuantizationType as Q
from safetensors.torch import save_file

from engine.quant.formats import CpuFeatures, resolve_weight_format
from engine.quant.source import WeightSource, weight_source

AVX2 = CpuFeatures("AVX2", False, "avx2", False)  # our int4 kernel, no oneDNN bf16
CAPABLE = CpuFeatures("AVX512", True, "avx512vnni", True)
CPU = torch.device("cpu")


def _gguf(path: Path, linears: Q, head: Q) -> Path:
    """A GGUF whose tensors have these types (their bytes are zeros: only the types are read)."""
    writer = GGUFWriter(path, "llama")
    for name, kind in (("token_embd.weight", head), ("blk.0.attn_q.weight", linears), ("blk.0.ffn_up.weight", linears)):
        block, size = GGML_QUANT_SIZES[kind]
        writer.add_tensor(name, np.zeros((64, 256 // block * size), dtype=np.uint8), raw_dtype=kind)
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(256, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(
    ("linears", "head", "lossless"),
    [(Q.Q4_1, Q.Q8_0, "int4"), (Q.Q4_0, Q.Q8_0, "int4"), (Q.Q4_K, Q.Q6_K, "gguf"), (Q.Q5_0, Q.Q8_0, "gguf"),
     (Q.Q8_0, Q.Q8_0, "gguf"), (Q.Q4_1, Q.F16, "fp32"), (Q.Q3_K, Q.Q6_K, "fp32")],
)
def test_a_gguf_is_int4_when_its_linears_are_q4_blocks_gguf_when_our_kernel_holds_its_types_else_fp32(
    tmp_path: Path, linears: Q, head: Q, lossless: str
) -> None:
    source = weight_source(tmp_path, _gguf(tmp_path / "m.gguf", linears, head))
    assert source is not None and source.lossless == lossless
    assert linears.name in source.held and head.name in source.held


def test_a_gguf_whose_linears_are_read_from_floats_is_fp32s(tmp_path: Path) -> None:
    source = weight_source(tmp_path, _gguf(tmp_path / "m.gguf", Q.Q4_1, Q.Q8_0), blockwise=False)
    assert source is not None and source.lossless == "fp32"


@pytest.mark.parametrize(
    ("dtype", "lossless"), [(torch.bfloat16, "bf16"), (torch.float32, "fp32"), (torch.float16, "fp32")]
)
def test_a_checkpoint_is_bf16_only_when_stored_in_bf16(tmp_path: Path, dtype: torch.dtype, lossless: str) -> None:
    tensors = {"a": torch.zeros(4, 4, dtype=dtype), "ids": torch.zeros(3, dtype=torch.int64)}  # ids: not a weight
    save_file(tensors, tmp_path / "model.safetensors")
    source = weight_source(tmp_path, None)
    assert source is not None and source.lossless == lossless
    assert weight_source(tmp_path / "elsewhere", None) is None  # no file: auto takes the fastest format


def test_auto_picks_the_files_own_format_where_the_cpu_runs_it_and_says_why() -> None:
    q4 = WeightSource("int4", "m.gguf's Q4_1 linears and Q8_0 embedding")
    picked = resolve_weight_format("auto", CPU, AVX2, source=q4)
    assert picked.fmt == "int4" and picked.note is None and not picked.wide_copy
    assert picked.choice == ("engine.weights auto: int4, the fastest format that keeps m.gguf's Q4_1 linears and "
                             "Q8_0 embedding exactly")
    bf16 = WeightSource("bf16", "m's BF16 weights")
    assert resolve_weight_format("auto", CPU, CAPABLE, source=bf16).fmt == "bf16"
    fallback = resolve_weight_format("auto", CPU, AVX2, source=bf16)  # no oneDNN bf16 GEMM here
    assert fallback.fmt == "fp32" and fallback.note is None  # auto asked for nothing in particular: not a warning
    assert fallback.choice is not None and "bf16 would keep m's BF16 weights exactly, but" in fallback.choice
    kquant = WeightSource("gguf", "g.gguf's Q4_K/Q6_K linears", native=True)
    picked = resolve_weight_format("auto", CPU, AVX2, source=kquant)
    assert picked.fmt == "gguf"
    assert "gguf, the fastest format that keeps g.gguf's Q4_K/Q6_K linears" in str(picked.choice)
    torch_only = resolve_weight_format("auto", CPU, CAPABLE, kernel="torch", source=kquant)  # torch's would round them
    assert torch_only.fmt == "fp32" and "gguf's blocks run on our int4/int8 kernel only" in str(torch_only.choice)
    q3 = resolve_weight_format("auto", CPU, CAPABLE, source=WeightSource("fp32", "g.gguf's Q3_K linears"))
    assert q3.fmt == "fp32" and "keeps g.gguf's Q3_K linears exactly" in str(q3.choice)
    torch_kernels = resolve_weight_format("auto", CPU, AVX2, kernel="torch", source=q4)
    assert torch_kernels.fmt == "fp32" and "engine.quant_kernel: torch" in str(torch_kernels.choice)


def test_gguf_asked_of_a_file_it_cannot_serve_as_it_is_is_refused_naming_the_setting() -> None:
    q3 = WeightSource("fp32", "g.gguf's Q3_K linears and Q6_K embedding")
    with pytest.raises(ValueError, match="engine.weights gguf: g.gguf's Q3_K linears and Q6_K embedding are not all"):
        resolve_weight_format("gguf", CPU, CAPABLE, source=q3)
    with pytest.raises(ValueError, match="do not come from a GGUF file"):
        resolve_weight_format("gguf", CPU, CAPABLE, source=None)
    served = resolve_weight_format("gguf", CPU, CAPABLE, source=WeightSource("int4", "m.gguf's Q4_0", native=True))
    assert served.fmt == "gguf" and served.note is None
