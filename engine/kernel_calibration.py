"""Timing two candidate matmul kernels on the model's own linears, on the CPU the engine runs on, with a cache.

Why measure at start instead of shipping thresholds: which kernel wins at a given
step size (rows) depends on the CPU's vector units, its caches and the BLAS torch
was built with. Thresholds measured on one Intel machine were wrong by up to 1.7x
on an AMD EPYC (MKL is poor there; see engine/packed_linear.py).

What is timed: the real weights of the first layers of the model (enough of them
that their bytes exceed a CPU's last-level cache, so a memory-bound one-row step
is measured reading memory, as in serving), each candidate at a handful of row
counts, best of a few repetitions (the machine may be shared), scaled to all layers.
The result depends only on the CPU, torch, the thread count, the weight format and
the linears' shapes, so it is cached under that key
(`~/.cache/specstream/calibration/<key>.json`) and later starts skip the timing.
What to do with the timings is engine.kernel_dispatch's business.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import os
import platform
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from pydantic import BaseModel, ValidationError

ROW_COUNTS = (1, 2, 4, 9, 16, 32, 64, 128)  # decode, verification, small batches, a prefill chunk
SAMPLE_BYTES = 64 << 20  # at least this many weight bytes timed per pass: more than a CPU's last-level cache
BUDGET_S = 1.5  # repetitions stop after this (at least MIN_REPS are taken)
MIN_REPS, MAX_REPS = 2, 5
METHOD = 1  # bump when what is timed changes: older cache entries then miss
NOISE_DIP = 0.6  # a step of more rows timed under this share of a smaller one's: the machine was busy

Kernel = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class KernelPair:
    """One linear's two candidates, both [T, in_features] -> [T, out]."""

    in_features: int
    base: Kernel  # what runs when the other kernel does not win (plain fp32 GEMM, or the quantized kernel)
    alt: Kernel  # the other kernel (oneDNN-prepacked fp32, or the bf16 copy)


@dataclass(frozen=True)
class KernelTimings:
    """Milliseconds per step of all the layers' linears, by row count, for each candidate."""

    rows: tuple[int, ...]
    base_ms: tuple[float, ...]
    alt_ms: tuple[float, ...]
    cached: bool = False  # read from the cache rather than measured now

    def __post_init__(self) -> None:
        if not (len(self.rows) == len(self.base_ms) == len(self.alt_ms)) or not self.rows:
            raise ValueError("timings need one base and one alt figure per row count")
        if list(self.rows) != sorted(set(self.rows)) or self.rows[0] < 1:
            raise ValueError(f"row counts must be increasing and positive, got {self.rows}")

    def noisy(self) -> bool:
        """True when a kernel took far less time for more rows: not what a kernel does (an idle AMD EPYC's worst
        dip is MKL's 0.82x from 2 to 4 rows) but what other processes taking the cores mid-measurement do."""
        return any(b < NOISE_DIP * a for ms in (self.base_ms, self.alt_ms) for a, b in itertools.pairwise(ms))


@torch.inference_mode()
def measure(
    pairs: list[KernelPair],
    dtype: torch.dtype,
    scale: float = 1.0,
    rows: tuple[int, ...] = ROW_COUNTS,
    budget_s: float = BUDGET_S,
) -> KernelTimings:
    """Best-of-N time of one pass over `pairs` with each kernel at each row count, times `scale`."""
    if not pairs:
        raise ValueError("nothing to measure: no linear layers")
    gen = torch.Generator().manual_seed(0)
    inputs = {
        (r, d): torch.randn(r, d, generator=gen).to(dtype) for r in rows for d in {p.in_features for p in pairs}
    }

    def one_pass(alt: bool, r: int) -> float:
        start = time.perf_counter()
        for p in pairs:
            (p.alt if alt else p.base)(inputs[(r, p.in_features)])
        return time.perf_counter() - start

    for r in rows:  # warm-up: oneDNN builds a primitive for each new shape on its first call
        one_pass(False, r)
        one_pass(True, r)
    best = {(alt, r): math.inf for alt in (False, True) for r in rows}
    start, reps = time.perf_counter(), 0
    while reps < MIN_REPS or (reps < MAX_REPS and time.perf_counter() - start < budget_s):
        for r in rows:  # both kernels at one row count back to back: load drifts hit both alike
            for alt in (reps % 2 == 1, reps % 2 == 0):
                best[(alt, r)] = min(best[(alt, r)], one_pass(alt, r))
        reps += 1
    ms = 1000.0 * scale
    return KernelTimings(rows, tuple(best[(False, r)] * ms for r in rows), tuple(best[(True, r)] * ms for r in rows))


def sample_layers(layer_bytes: list[int]) -> tuple[int, float]:
    """How many leading layers to time (their weight bytes past SAMPLE_BYTES), and the scale to all layers."""
    total, n = 0, 0
    for size in layer_bytes:
        total, n = total + size, n + 1
        if total >= SAMPLE_BYTES:
            break
    return n, len(layer_bytes) / max(n, 1)


def cpu_identity() -> str:
    """The CPU's model name and instruction flags (what decides which kernel is fast)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux
        return f"{platform.machine()} {platform.processor()}"
    fields: dict[str, str] = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        fields.setdefault(name.strip(), value.strip())
    return f"{fields.get('model name', platform.processor())} | {fields.get('flags', '')}"


def cache_key(fmt: str, shapes: list[tuple[int, int]], rows: tuple[int, ...] = ROW_COUNTS) -> dict[str, object]:
    """Everything the timings depend on. shapes: (out, in) of every linear timed for the model."""
    return {
        "method": METHOD,
        "cpu": cpu_identity(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "weights": fmt,
        "shapes": sorted(shapes),
        "rows": list(rows),
    }


class _CacheFile(BaseModel):
    """The cache entry on disk: the key it was measured under, and the timings."""

    key: dict[str, object]
    rows: list[int]
    base_ms: list[float]
    alt_ms: list[float]


def cache_path(cache_dir: Path, key: dict[str, object]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    return cache_dir / f"{key['weights']}-{digest[:16]}.json"


def load_cached(cache_dir: Path, key: dict[str, object]) -> KernelTimings | None:
    """The cached timings for key, or None (missing, unreadable or written under another key)."""
    path = cache_path(cache_dir, key)
    try:
        entry = _CacheFile.model_validate_json(path.read_bytes())
        if json.loads(json.dumps(entry.key)) != json.loads(json.dumps(key)):
            return None  # a hash collision or a hand-edited file: measure again
        return KernelTimings(tuple(entry.rows), tuple(entry.base_ms), tuple(entry.alt_ms), cached=True)
    except FileNotFoundError:
        return None
    except (OSError, ValidationError, ValueError) as e:
        logging.getLogger(__name__).warning("kernel calibration cache %s unreadable (%s): measuring again", path, e)
        return None


def save_cached(cache_dir: Path, key: dict[str, object], t: KernelTimings) -> None:
    """Write atomically (temporary file, then rename): a worker starting alongside never reads half a file."""
    entry = _CacheFile(key=key, rows=list(t.rows), base_ms=list(t.base_ms), alt_ms=list(t.alt_ms))
    path = cache_path(cache_dir, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(entry.model_dump_json())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def calibrated(cache_dir: Path, key: dict[str, object], run: Callable[[], KernelTimings]) -> KernelTimings:
    """The cached timings for key, else run() (then cached). A noisy measurement is taken again once, and
    never cached: a busy moment must not decide every later start."""
    hit = load_cached(cache_dir, key)
    if hit is not None:
        return hit
    t = run()
    if t.noisy():
        t = run()
    if t.noisy():
        return t
    try:
        save_cached(cache_dir, key, t)
    except OSError as e:  # a read-only home: calibrate again next start rather than fail this one
        logging.getLogger(__name__).warning("kernel calibration not cached (%s)", e)
    return t
