"""Kernel dispatch calibrated per CPU: the row windows decided from given timings (the Intel dev machine's
table gives back the old fixed thresholds, the AMD one packs every step), int4/int8 windows that keep one
request on one kernel, the timing cache hit and missed by its key, a bad engine.kernel_dispatch refused
naming the key, and real engines that calibrate, log the decision and keep speculative text exact."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from _engine_factories import (  # noqa: F401
    every_format_runs,
    kv_bytes_for,
    loaded_from_hf,
    make_engine,
    needs_bf16_gemm,
    random_prompts,
    single_thread,
    tiny_hf_model,
)
from pydantic import ValidationError
from torch import nn

from engine.config import EngineConfig, SpeculationConfig, embedded_engine_config
from engine.kernel_calibration import KernelPair, KernelTimings, cache_key, cache_path, calibrated, measure
from engine.kernel_dispatch import packed_window, quant_window
from engine.llm_engine import LLMEngine
from engine.packed_linear import PackedRows, PrepackedLinear
from engine.quant.linear import QuantizedLinear
from engine.request import EngineRequest, SamplingOptions

pytestmark = pytest.mark.usefixtures("single_thread", "every_format_runs")

ROWS = (1, 2, 4, 9, 16, 32, 64, 128)
# ms per step, plain / prepacked, from engine/packed_linear.py's docstring (Intel) and the task's AMD EPYC.
INTEL = KernelTimings(
    ROWS, (15.3, 17.6, 27.6, 36.3, 39.1, 48.1, 66.6, 110.2), (19.7, 20.4, 21.6, 26.0, 30.4, 42.7, 69.3, 108.8)
)
AMD = KernelTimings(
    ROWS, (38.4, 56.3, 45.9, 50.4, 48.3, 65.7, 99.7, 168.8), (22.7, 23.6, 19.4, 22.3, 28.3, 44.1, 73.9, 134.4)
)


def _timings(base: list[float], alt: list[float]) -> KernelTimings:
    return KernelTimings(ROWS, tuple(base), tuple(alt))


def test_intel_timings_give_back_the_old_fixed_window() -> None:
    # 128 rows: packed only 1.3 % faster, under the saving a second copy of the weights must buy.
    assert packed_window(INTEL) == PackedRows(min_rows=4, max_rows=48)


def test_amd_timings_pack_every_measured_row_count() -> None:
    assert packed_window(AMD) == PackedRows(min_rows=1, max_rows=128)


def test_no_packed_copy_where_it_never_wins() -> None:
    assert packed_window(_timings([10.0] * 8, [10.0] * 8)) is None


def test_the_longest_run_of_wins_is_the_window_and_a_stray_win_is_ignored() -> None:
    base = [10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0]
    alt = [5.0, 11.0, 11.0, 5.0, 5.0, 5.0, 11.0, 11.0]  # 1 row: noise; 9..32: a real run
    assert packed_window(_timings(base, alt)) == PackedRows(min_rows=7, max_rows=48)


def test_quantized_kernel_for_every_step_where_the_bf16_copy_never_wins() -> None:
    assert quant_window(_timings([5.0] * 8, [9.0] * 8), request_rows=9).max_rows is None


def test_bf16_copy_for_every_step_where_it_wins_at_one_row() -> None:
    window = quant_window(_timings([9.0] * 8, [5.0] * 8), request_rows=9)
    assert window.max_rows == 0 and window.note == ""


def test_a_crossover_past_one_requests_steps_is_taken_as_measured() -> None:
    base = [5, 6, 7, 9, 12, 30, 60, 120]
    alt = [9, 9, 9, 10, 11, 20, 40, 80]  # the copy wins from 16 rows
    assert quant_window(_timings(base, alt), request_rows=9).max_rows == 12  # half way between 9 and 16


@pytest.mark.parametrize(
    ("base", "alt", "chosen"),
    [
        ([5, 6, 9, 10, 14, 30, 60, 120], [9, 9, 7, 8, 10, 20, 40, 80], 9),  # cheaper in sum on the quantized kernel
        ([5, 8, 12, 20, 14, 30, 60, 120], [9, 9, 7, 8, 10, 20, 40, 80], 0),  # cheaper in sum on the copy
    ],
)
def test_a_crossover_inside_one_requests_steps_keeps_them_on_one_kernel(
    base: list[float], alt: list[float], chosen: int
) -> None:
    window = quant_window(_timings(base, alt), request_rows=9)
    assert window.max_rows == chosen
    assert "measured crossover at 3 rows" in window.note and "speculative text stays equal" in window.note


def _pairs() -> list[KernelPair]:
    torch.manual_seed(0)
    lins = [nn.Linear(64, 96).requires_grad_(False), nn.Linear(96, 64).requires_grad_(False)]
    return [KernelPair(lin.in_features, lin, lambda x, lin=lin: lin(x) * 1.0) for lin in lins]


def test_measure_times_both_kernels_at_every_row_count_scaled() -> None:
    t = measure(_pairs(), torch.float32, scale=30.0, rows=(1, 4, 16), budget_s=0.05)
    assert t.rows == (1, 4, 16) and not t.cached
    assert all(ms > 0 for ms in t.base_ms + t.alt_ms)


def test_measure_refuses_an_empty_model() -> None:
    with pytest.raises(ValueError, match="no linear layers"):
        measure([], torch.float32)


def test_calibration_is_measured_once_then_read_from_the_cache(tmp_path: Path) -> None:
    runs: list[int] = []

    def run() -> KernelTimings:
        runs.append(1)
        return AMD

    key = cache_key("fp32", [(960, 576), (576, 576)])
    assert calibrated(tmp_path, key, run) == AMD and len(runs) == 1
    hit = calibrated(tmp_path, key, run)
    assert len(runs) == 1 and hit.cached and (hit.base_ms, hit.alt_ms) == (AMD.base_ms, AMD.alt_ms)


@pytest.mark.parametrize(
    "other",
    [
        cache_key("int4", [(960, 576), (576, 576)]),  # another weight format
        cache_key("fp32", [(960, 576)]),  # another model's shapes
        {**cache_key("fp32", [(960, 576), (576, 576)]), "threads": 97},  # another thread count
        {**cache_key("fp32", [(960, 576), (576, 576)]), "cpu": "another CPU | avx2"},
        {**cache_key("fp32", [(960, 576), (576, 576)]), "torch": "0.0.1"},
    ],
)
def test_a_different_key_misses_the_cache(tmp_path: Path, other: dict[str, object]) -> None:
    calibrated(tmp_path, cache_key("fp32", [(960, 576), (576, 576)]), lambda: AMD)
    assert calibrated(tmp_path, other, lambda: INTEL) == INTEL


def test_a_noisy_measurement_is_taken_again_and_never_cached(tmp_path: Path) -> None:
    # Under load: 9 rows timed at a fifth of 4 rows, which no kernel does.
    busy = _timings([77, 131, 209, 348, 96, 480, 377, 581], [71, 67, 31, 541, 112, 255, 461, 778])
    runs: list[int] = []

    def run() -> KernelTimings:
        runs.append(1)
        return busy

    key = cache_key("fp32", [(960, 576)])
    assert busy.noisy() and not AMD.noisy() and not INTEL.noisy()
    assert calibrated(tmp_path, key, run).noisy() and len(runs) == 2
    assert not cache_path(tmp_path, key).exists()


def test_a_corrupt_cache_entry_is_measured_again(tmp_path: Path) -> None:
    key = cache_key("fp32", [(960, 576)])
    cache_path(tmp_path, key).write_text("{not json")
    assert calibrated(tmp_path, key, lambda: INTEL) == INTEL
    assert json.loads(cache_path(tmp_path, key).read_text())["base_ms"] == list(INTEL.base_ms)


def test_the_key_holds_what_decides_the_timings() -> None:
    key = cache_key("int8", [(576, 576)])
    assert {"cpu", "torch", "threads", "weights", "shapes", "rows"} <= key.keys()
    assert key["threads"] == torch.get_num_threads() and key["weights"] == "int8"


def test_a_bad_dispatch_mode_is_refused_naming_the_key() -> None:
    with pytest.raises(ValidationError, match=r"kernel_dispatch\s+Input should be 'auto' or 'fixed'"):
        EngineConfig(kernel_dispatch="fast")


def _packed_windows(engine: Any) -> set[PackedRows]:
    return {m._packed.rows for m in engine.model.modules() if isinstance(m, PrepackedLinear)}


@needs_bf16_gemm
def test_fixed_dispatch_keeps_the_old_thresholds() -> None:
    engine = make_engine(tiny_hf_model("llama"), kernel_dispatch="fixed")
    assert _packed_windows(engine) == {PackedRows(4, 48)}
    quant = make_engine(tiny_hf_model("qwen2"), weights="int8", kernel_dispatch="fixed")
    assert {m.max_quant_rows for m in quant.model.modules() if isinstance(m, QuantizedLinear)} == {9}


def _auto_engine(hf: Any, said: list[str]) -> LLMEngine:
    no_spec = SpeculationConfig(enabled=False)
    cfg = embedded_engine_config(model="tiny", kv_cache_bytes=kv_bytes_for(hf, 1024), speculation=no_spec)
    assert cfg.kernel_dispatch == "auto"  # the default
    return LLMEngine(loaded_from_hf(hf), cfg, progress=said.append)


def test_auto_dispatch_calibrates_logs_one_line_and_caches(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SPECSTREAM_CACHE_DIR", str(tmp_path))
    hf = tiny_hf_model("llama")
    first: list[str] = []
    second: list[str] = []
    engine = _auto_engine(hf, first)
    _auto_engine(hf, second)
    line = [s for s in first if s.startswith("kernel dispatch")]
    again = [s for s in second if s.startswith("kernel dispatch")]
    assert len(line) == 1 and line[0].startswith("kernel dispatch: fp32") and "measured now" in line[0]
    assert len(again) == 1
    if "too noisy" not in line[0]:  # a tiny model's microsecond timings can be, on a busy machine
        assert again[0].endswith("cached)")
        assert len(list((tmp_path / "calibration").glob("fp32-*.json"))) == 1
    # The packed copy exists exactly when the line says some row count uses it.
    assert bool(_packed_windows(engine)) == ("prepacked for rows" in line[0])


def _quant_window(engine: LLMEngine) -> int | None:
    """The quantized kernel's row limit, the same in every layer; None: every step on it (no bf16 copy)."""
    layers = [m for m in engine.model.modules() if isinstance(m, QuantizedLinear)]
    windows = {None if m.wide is None else m.max_quant_rows for m in layers}
    assert len(windows) == 1, windows
    return windows.pop()


@needs_bf16_gemm
@pytest.mark.parametrize("fmt", ["int4", "int8"])
def test_auto_dispatch_keeps_speculative_text_equal_to_plain(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fmt: str
) -> None:
    # Whatever this CPU measures, one request's 1..1 + k row steps stay on one kernel, so the engine's
    # speculative text equals its own plain text. One engine serves both: two engines may each measure
    # (a noisy measurement is not cached) and decide different kernels, which is another model's text.
    monkeypatch.setenv("SPECSTREAM_CACHE_DIR", str(tmp_path))
    ngram = SpeculationConfig(enabled=True, method="ngram", max_draft_tokens=4, adaptive=False)
    engine = make_engine(tiny_hf_model("qwen2"), weights=fmt, speculation=ngram, kernel_dispatch="auto")
    window = _quant_window(engine)
    assert window is None or window == 0 or window >= 1 + ngram.max_draft_tokens, window
    prompt = random_prompts([5], seed=4)[0] * 4  # repetitive: drafts are found
    params = SamplingOptions(max_tokens=20, temperature=0.8, top_p=0.9, seed=7, ignore_eos=True)
    plain = engine.generate([EngineRequest("plain", prompt, params, speculation=False)])["plain"]
    spec = engine.generate([EngineRequest("spec", prompt, params)])["spec"]
    assert plain.spec.drafted == 0 and spec.spec.drafted > 0
    assert spec.token_ids == plain.token_ids


@needs_bf16_gemm
def test_turning_speculation_off_keeps_the_kernels_it_would_verify_on(monkeypatch: pytest.MonkeyPatch) -> None:
    # int8 timings measured on the AMD EPYC: the bf16 copy wins from 4 rows on, a crossover inside one
    # request's 1..9 row steps. An engine with speculation off must choose the window an engine with it on
    # chooses, or "plain" and speculative text come from different kernels (seeded text drifted at token 16).
    crossing = _timings([15.1, 19.2, 22.0, 38.8, 56.2, 100.9, 191.3, 371.1], [21.3, 20.0, 16.2, 20.6, 26.6, 42.2, 72.3, 134.9])
    monkeypatch.setattr("engine.kernel_dispatch._quant_timings", lambda *args: crossing)
    target = tiny_hf_model("qwen2")
    windows = []
    for enabled in (False, True):
        spec = SpeculationConfig(enabled=enabled, method="ngram", max_draft_tokens=8, adaptive=False)
        windows.append(_quant_window(make_engine(target, weights="int8", speculation=spec, kernel_dispatch="auto")))
    assert windows[0] == windows[1] == 0  # every step on the bf16 copy: it costs less over 1..9 rows


def test_without_a_bf16_copy_int4_has_no_dispatch_to_make_and_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.quant import formats

    real = formats.CpuFeatures.detect()
    if not real.qgemm:
        pytest.skip("our int4/int8 kernel does not run here")
    # A CPU whose oneDNN refuses bf16 (AVX2): prepack_weights asks for the copy, none can be made.
    avx2 = formats.CpuFeatures("AVX2", False, real.qgemm, False)
    monkeypatch.setattr(formats.CpuFeatures, "detect", classmethod(lambda cls: avx2))
    engine = make_engine(tiny_hf_model("qwen2"), weights="int4", prepack_weights=True, kernel_dispatch="auto")
    assert engine.weight_format == "int4" and _quant_window(engine) is None


@needs_bf16_gemm
@pytest.mark.parametrize(("kernel", "window"), [("auto", None), ("torch", 9)])
def test_noisy_timings_keep_every_step_on_our_kernel_and_torchs_on_the_fixed_window(
    monkeypatch: pytest.MonkeyPatch, kernel: str, window: int | None
) -> None:
    # Ours gives a row the same bits in any step, so when the timings cannot tell, the step stays exact; torch's
    # kernels keep the fixed thresholds they were measured with.
    busy = _timings([77, 131, 209, 348, 96, 480, 377, 581], [71, 67, 31, 541, 112, 255, 461, 778])
    assert busy.noisy()
    monkeypatch.setattr("engine.kernel_dispatch._quant_timings", lambda *args: busy)
    engine = make_engine(tiny_hf_model("qwen2"), weights="int4", quant_kernel=kernel, kernel_dispatch="auto")
    assert _quant_window(engine) == window


@needs_bf16_gemm
@pytest.mark.parametrize(("bf16_wins", "copies"), [(False, 0), (True, 1)])
def test_the_bf16_copy_is_made_only_where_the_dispatch_runs_a_step_on_it(
    monkeypatch: pytest.MonkeyPatch, bf16_wins: bool, copies: int
) -> None:
    # The first bf16 copies of a process cost ~2 s of a worker's start on 2 cores: with the timings cached, an
    # engine whose every step stays on the quantized kernel never makes them.
    import engine.quant.linear as linear

    made: list[int] = []

    class Counting(linear.Bf16Kernel):
        def __init__(self, weight: torch.Tensor) -> None:
            made.append(1)
            super().__init__(weight)

    monkeypatch.setattr(linear, "Bf16Kernel", Counting)
    ms = [float(r) for r in ROWS]
    timings = _timings(ms, [m / 4 for m in ms]) if bf16_wins else _timings(ms, [m * 4 for m in ms])
    monkeypatch.setattr("engine.kernel_dispatch._quant_timings", lambda *args: timings)
    engine = make_engine(tiny_hf_model("qwen2"), weights="int8", kernel_dispatch="auto")
    layers = [m for m in engine.model.modules() if isinstance(m, QuantizedLinear)]
    assert len(made) == copies * len(layers)
    assert _quant_window(engine) == (0 if bf16_wins else None)
    assert all(m.source is None for m in layers)  # the kept quantized tensors are let go either way
