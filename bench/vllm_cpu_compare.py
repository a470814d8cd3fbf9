"""Issue 43's comparison: our engine against vLLM's CPU build on the same model and prompts, at batch 1 and under
concurrency, plain and with prompt lookup (n-gram).

    python -m bench.vllm_cpu_compare                                  # everything, 2 alternated rounds
    python -m bench.vllm_cpu_compare --ours-weights bf16 --concurrency 16 --rounds 1   # one format, one load

Rows (greedy, --max-new tokens with EOS ignored, bench/workloads.py's three prompts as token ids, so both sides see
the same tokens): batch 1 is each prompt alone, one after the other; "concurrent:N" is N requests (the three
prompts in turn) submitted at once, tokens/s over the whole batch.
* vLLM: its offline engine (vllm.LLM) in .venv-vllm (`./dev setup vllm`), bf16 (its format on CPU), with the
  arguments our vLLM worker derives from the same engine settings (streams.worker.vllm_mapping.engine_kwargs) but
  compiled (enforce_eager off: its CPU build's fast path), both cores bound (VLLM_CPU_OMP_THREADS_BIND=0-1);
  n-gram is its speculative_config with our settings' draft length and n-gram sizes.
* ours: bench.engine_bench's rows ours_plain / ours_ngram in each of --ours-weights, torch on 2 threads.
Each row runs in a subprocess of its own, one at a time; every round runs every row, and the table gives medians
over rounds and the ratio of each of ours to vLLM's row of the same method. Not part of CI.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.engine_bench import OurEngine, RowResult, _mixed, _prompts, _spawn
from bench.result_files import default_out
from bench.workloads import ALL

MODEL = "smollm2-135m-instruct"
# Both sides: the same limits (64 running requests, 1 GiB of KV), both cores.
SETTINGS = {"max_model_len": 2048, "kv_cache_bytes": "1GiB", "max_running_requests": 64}
ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0-1", "OMP_NUM_THREADS": "2"}
METHODS = ("plain", "ngram")


def scenarios(concurrency: list[int]) -> list[str]:
    return [f"concurrent:{n}" if n > 1 else "single" for n in concurrency]


# ----------------------------------------------------------------------------- inside .venv-vllm


def offline_vllm(speculation: Any, *, stats: bool = False) -> tuple[Any, Any]:
    """vLLM's offline engine (vllm.LLM) with the arguments our vLLM worker derives from these settings
    (streams.worker.vllm_mapping), but compiled (stats: its metrics on, for speculation counts); and the tokenizer
    our engine uses (the same ids on both sides). No LoRA slots, as in our rows."""
    from transformers import AutoTokenizer
    from vllm import LLM

    from engine.config import embedded_engine_config
    from engine.loader import resolve_model_dir
    from streams.worker.vllm_mapping import engine_kwargs

    config = embedded_engine_config(model=MODEL, speculation=speculation, **SETTINGS)
    model_dir = str(resolve_model_dir(MODEL))
    kwargs = engine_kwargs(config, model_dir, SETTINGS["max_model_len"])
    llm = LLM(**(kwargs | {"enforce_eager": False, "disable_log_stats": not stats}))
    return llm, AutoTokenizer.from_pretrained(model_dir)


def vllm_rows(method: str, scenario_names: list[str], max_new: int) -> list[RowResult]:
    """One vLLM engine for ``method``, every scenario on it (its start and compilation are not timed)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm, tokenizer = offline_vllm({"enabled": method != "plain", "method": "ngram"})
    params = SamplingParams(temperature=0.0, max_tokens=max_new, ignore_eos=True)

    def run(names: list[str], sampling: SamplingParams = params) -> tuple[float, dict[str, list[int]]]:
        prompts = [TokensPrompt(prompt_token_ids=ids) for ids in _prompts(tokenizer, names)]
        start = time.perf_counter()
        outputs = llm.generate(prompts, sampling, use_tqdm=False)
        return time.perf_counter() - start, {f"{i}:{n}": list(o.outputs[0].token_ids)
                                              for i, (n, o) in enumerate(zip(names, outputs))}

    def warm(names: list[str]) -> None:  # untimed: the compiled graph's shapes for this batch
        run(names, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))

    results = []
    for scenario in scenario_names:
        if scenario == "single":
            warm(["open_question"])
            for workload in ALL:
                secs, tokens = run([workload.name])
                results.append(RowResult(f"vllm_{method}", f"single:{workload.name}", max_new, secs, tokens))
        else:
            warm(_mixed(int(scenario.split(":")[1])))
            secs, tokens = run(_mixed(int(scenario.split(":")[1])))
            total = sum(map(len, tokens.values()))
            results.append(RowResult(f"vllm_{method}", scenario, total, secs, tokens))
    return results


# ----------------------------------------------------------------------------- parent side


def spawn_vllm(method: str, scenario_names: list[str], max_new: int) -> list[RowResult]:
    from streams.commands.vllm_env import vllm_python

    print(f"  running vllm_{method} on {', '.join(scenario_names)} ...", file=sys.stderr, flush=True)
    cmd = [str(vllm_python()), "-m", "bench.vllm_cpu_compare", "--vllm-row", method,
           "--scenarios", ",".join(scenario_names), "--max-new", str(max_new)]
    with tempfile.TemporaryFile("w+") as out:
        subprocess.run(cmd, stdout=out, check=True, env=os.environ | ENV)
        out.seek(0)
        return [RowResult(**d) for d in json.loads(out.read().strip().splitlines()[-1])]


def spawn_ours(weights: str, method: str, scenario_names: list[str], max_new: int) -> list[RowResult]:
    ours = OurEngine(model=MODEL, weights=weights)
    rows = []
    for scenario in scenario_names:
        for r in _spawn(f"ours_{method}", scenario, max_new, timeout_s=1800, ours=ours):
            rows.append(RowResult(**(asdict(r) | {"row": f"ours_{method}@{weights}"})))
    return rows


def medians(rounds: list[list[RowResult]]) -> dict[tuple[str, str], float]:
    """Median tokens/s per (row, scenario) over rounds; batch 1 sums its three prompts' tokens and seconds."""
    per: dict[tuple[str, str], list[float]] = {}
    for results in rounds:
        totals: dict[tuple[str, str], list[float]] = {}
        for r in results:
            key = (r.row, "batch 1" if r.scenario.startswith("single:") else r.scenario)
            tokens, seconds = totals.get(key, [0.0, 0.0])
            totals[key] = [tokens + r.new_tokens, seconds + r.seconds]
        for key, (tokens, seconds) in totals.items():
            per.setdefault(key, []).append(tokens / seconds)
    return {key: statistics.median(values) for key, values in per.items()}


def table(figures: dict[tuple[str, str], float], weights: list[str]) -> str:
    columns = sorted({s for _, s in figures}, key=lambda s: (s != "batch 1", int(s.split(":")[-1]) if ":" in s else 0))
    lines = ["| row | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for method in [m for m in METHODS if any(row.endswith(m) or f"_{m}@" in row for row, _ in figures)]:
        base = f"vllm_{method}"
        lines.append(f"| {base} (bf16) | " + " | ".join(f"{figures.get((base, c), 0):.1f}" for c in columns) + " |")
        for fmt in weights:
            row = f"ours_{method}@{fmt}"
            cells = [f"{figures[(row, c)]:.1f} ({figures[(row, c)] / figures[(base, c)]:.2f}x)"
                     if (row, c) in figures and figures.get((base, c)) else "-" for c in columns]
            lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ours-weights", default="bf16,int4,int8", help="our formats, comma-separated")
    parser.add_argument("--concurrency", default="1,16,64", help="1 is batch 1 (each prompt alone)")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--max-new", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--skip-vllm", action="store_true")
    parser.add_argument("--out", default=None, help="the raw result file (default bench/results/<date>-...)")
    parser.add_argument("--vllm-row", choices=METHODS, help=argparse.SUPPRESS)  # the subprocess inside .venv-vllm
    parser.add_argument("--scenarios", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.vllm_row:
        results = vllm_rows(args.vllm_row, args.scenarios.split(","), args.max_new)
        print(json.dumps([asdict(r) for r in results]))
        return 0
    weights = args.ours_weights.split(",")
    methods = args.methods.split(",")
    names = scenarios([int(c) for c in args.concurrency.split(",")])
    os.environ["OMP_NUM_THREADS"] = "2"  # ours: the same two threads as vLLM's bound ones
    rounds = []
    for round_no in range(args.rounds):
        print(f"round {round_no + 1} of {args.rounds}", file=sys.stderr, flush=True)
        results: list[RowResult] = []
        for method in methods:
            if not args.skip_vllm:
                results += spawn_vllm(method, names, args.max_new)
            for fmt in weights:
                results += spawn_ours(fmt, method, names, args.max_new)
        rounds.append(results)
    figures = medians(rounds)
    print(table(figures, weights))
    out = Path(args.out or default_out("vllm-cpu-compare"))
    command = "python -m bench.vllm_cpu_compare " + " ".join(sys.argv[1:] if argv is None else argv)
    out.write_text(json.dumps({
        "command": command.strip(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "settings": SETTINGS, "env": ENV,
        "tokens_per_s": {f"{row} {scenario}": value for (row, scenario), value in figures.items()},
        "rounds": [[{k: v for k, v in asdict(r).items() if k != "token_ids"} for r in results] for results in rounds],
    }, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
