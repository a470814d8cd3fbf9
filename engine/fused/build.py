"""Compile and load the engine's C++ ops (engine/fused/*.cpp) once per source, torch and compiler.

Why not torch.utils.cpp_extension.load: it needs ninja and pybind11's headers for a module we do
not need; these files only register ops (TORCH_LIBRARY), called as torch.ops.specstream.*. One g++
call builds a shared library into ~/.cache/specstream/ops/<key>/ (~1 minute on the 2-core dev machine, 58 s on
2026-12-07; `specstream prepare` builds it, and processes starting together wait for one build); a later start
loads it. A machine without a C++ compiler, or a failed build, gets the reason back and
the engine runs its eager path.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

SOURCE_DIR = Path(__file__).parent
# -fopenmp: at::parallel_for runs on torch's threads (without it, one thread); the process already holds torch's
# libgomp, which the library's libgomp.so.1 resolves to.
FLAGS = ("-O2", "-std=c++20", "-fopenmp", "-fPIC", "-shared", "-Wno-psabi")
_loaded: dict[str, Built] = {}


@dataclass(frozen=True)
class Built:
    library: Path | None  # None: not available, see why
    why: str  # how it was obtained ("built in 12.1 s", "cached") or why not


def ops_cache_dir() -> Path:
    """Beside the converted models: $SPECSTREAM_CACHE_DIR/ops, default ~/.cache/specstream/ops."""
    from engine.model_ref import cache_root

    return cache_root().parent / "ops"


def _compiler() -> str | None:
    """$CXX when set (a compiler it names that is not there means none), else g++ or c++ on PATH."""
    named = os.environ.get("CXX")
    return shutil.which(named) if named else shutil.which("g++") or shutil.which("c++")


def _command(compiler: str, source: Path, target: Path) -> list[str]:
    from torch.utils.cpp_extension import include_paths, library_paths

    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [
        compiler, *FLAGS, str(source), "-o", str(target),
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}", *(f"-I{p}" for p in include_paths()),
        *(f"-L{p}" for p in library_paths()), "-lc10", "-ltorch_cpu", "-ltorch",
    ]  # fmt: skip


def _key(compiler: str, source: Path) -> str:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=False).stdout
    h = hashlib.sha256(source.read_bytes())
    for header in sorted(source.parent.glob("*.h")):  # what the sources include
        h.update(header.read_bytes())
    h.update(f"{torch.__version__}|{torch._C._GLIBCXX_USE_CXX11_ABI}|{version}|{' '.join(FLAGS)}".encode())
    return h.hexdigest()[:16]


def load_ops(name: str) -> Built:
    """Build (or find built) engine/fused/<name>.cpp and load its ops into this process; never raises."""
    if name in _loaded:
        return _loaded[name]
    _loaded[name] = built = _build_and_load(name)
    return built


def _build(compiler: str, source: Path, target: Path) -> str | None:
    """Compile source into target; why it failed, or None. Built beside the target and renamed: a concurrent start
    never loads a half-written library."""
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        partial = Path(tmp) / target.name
        done = subprocess.run(_command(compiler, source, partial), capture_output=True, text=True, check=False)
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines()
            first = next((line for line in lines if "error" in line), lines[-1] if lines else "no output")
            return f"building {source.name} failed ({compiler}): {first.strip()}"
        partial.replace(target)
    return None


def _build_and_load(name: str) -> Built:
    compiler = _compiler()
    if compiler is None:
        return Built(None, "no C++ compiler (g++ or $CXX) on this machine")
    source = SOURCE_DIR / f"{name}.cpp"
    if not source.exists():
        return Built(None, f"{source} is not installed (package data)")
    target = ops_cache_dir() / _key(compiler, source) / f"{name}.so"
    why = "cached"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        # One build per key: processes starting together (test workers, a worker and its batch lane) wait for the
        # first one's library instead of each compiling it (a minute of both cores apiece).
        with (target.parent / f".{name}.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not target.exists():
                start = time.perf_counter()
                failed = _build(compiler, source, target)
                if failed is not None:
                    return Built(None, failed)
                why = f"built in {time.perf_counter() - start:.1f} s"
    try:
        torch.ops.load_library(str(target))
    except OSError as e:
        return Built(None, f"loading {target} failed: {e}")
    return Built(target, why)
