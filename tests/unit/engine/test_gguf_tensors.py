"""A GGUF's tensors read past its metadata are gguf's own: the same names, types, shapes and bytes as GGUFReader
gives, whatever the metadata holds (a vocabulary of strings, nested arrays, every scalar type, another alignment)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGUFReader, GGUFValueType, GGUFWriter
from gguf import GGMLQuantizationType as Q

from engine.quant.gguf_tensors import read_tensors


def _write(path: Path, alignment: int | None) -> Path:
    rng = np.random.default_rng(0)
    writer = GGUFWriter(path, "llama")
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    writer.add_token_list([f"tok{i}é" for i in range(3000)])  # strings of several byte lengths, non-ASCII
    writer.add_token_scores([float(i) for i in range(3000)])
    writer.add_array("test.nested", [[1, 2], [3]])
    for kind, value in ((GGUFValueType.UINT8, 7), (GGUFValueType.INT16, -3), (GGUFValueType.UINT64, 1 << 40),
                        (GGUFValueType.FLOAT64, 0.5), (GGUFValueType.BOOL, True), (GGUFValueType.STRING, "x")):
        writer.add_key_value(f"test.{kind.name.lower()}", value, kind)
    for name, kind in (("token_embd.weight", Q.Q8_0), ("blk.0.attn_q.weight", Q.Q4_1), ("blk.0.ffn_up.weight", Q.Q4_K)):
        block, size = GGML_QUANT_SIZES[kind]
        codes = rng.integers(0, 255, (48, 256 // block * size), dtype=np.uint8)
        writer.add_tensor(name, codes, raw_dtype=kind)
    writer.add_tensor("blk.0.attn_norm.weight", rng.standard_normal(256).astype(np.float32))
    writer.add_tensor("blk.0.bias", rng.standard_normal((3, 5)).astype(np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("alignment", [None, 64])
def test_every_tensor_is_what_gguf_reads(tmp_path: Path, alignment: int | None) -> None:
    path = _write(tmp_path / "m.gguf", alignment)
    ours, theirs = read_tensors(path), GGUFReader(path).tensors
    assert [t.name for t in ours] == [t.name for t in theirs]
    for mine, gguf_s in zip(ours, theirs, strict=True):
        assert mine.tensor_type == gguf_s.tensor_type and mine.shape == tuple(int(d) for d in gguf_s.shape)
        assert mine.data.dtype == gguf_s.data.dtype and mine.data.shape == gguf_s.data.shape
        assert np.array_equal(mine.data, gguf_s.data), mine.name


def test_a_file_that_is_not_gguf_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(b"\0" * 64)
    with pytest.raises(ValueError, match="model.bin is not a little-endian GGUF file"):
        read_tensors(path)
