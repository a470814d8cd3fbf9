"""engine.safetensors_file: a safetensors file read tensor by tensor with pread, never mapped."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.safetensors_file import SafetensorsFile


def test_the_safetensors_reader_gives_every_dtype_bit_for_bit_without_mapping_the_file(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    tensors = {
        "f32": torch.randn(3, 5), "bf16": torch.randn(7).to(torch.bfloat16), "f16": torch.randn(2, 2).half(),
        "i8": torch.randint(-128, 127, (4, 4), dtype=torch.int8), "u8": torch.randint(0, 255, (9,), dtype=torch.uint8),
        "i64": torch.arange(6).view(2, 3), "bool": torch.tensor([True, False, True]), "empty": torch.zeros(0, 4),
    }  # fmt: skip
    path = tmp_path / "t.safetensors"
    save_file(tensors, str(path), metadata={"k": "v"})
    with SafetensorsFile(path) as f:
        assert set(f.keys()) == set(tensors) and f.metadata == {"k": "v"}
        for name, tensor in tensors.items():
            read = f.read(name)
            assert read.dtype == tensor.dtype and torch.equal(read, tensor), name
        assert str(path) not in Path("/proc/self/maps").read_text()
    path.write_bytes(path.read_bytes()[:-8])
    with SafetensorsFile(path) as f, pytest.raises(ValueError, match="ends inside tensor"):
        for name in f.keys():  # the last tensor in the file is cut short
            f.read(name)
