"""Engine benchmark: our engine against Hugging Face on the same machine, in one run.

    python -m bench.engine_bench            # everything (about half an hour on 2 cores)
    python -m bench.engine_bench --quick    # 32 new tokens, 4 and 8 concurrent: a smoke run
    python -m bench.engine_bench --weights int4 --rows ours_plain,ours_ngram   # a weight format (engine.weights)
    python -m bench.engine_bench --kernel-dispatch fixed ...   # the Intel thresholds instead of this CPU's (A/B)
    python -m bench.engine_bench --weights int4 --fused-step off ...   # layer by layer instead of one C++ call (A/B)
    python -m bench.engine_bench --weights int4 --quant-kernel torch ...   # torch's int4/int8 kernels (A/B)
    python -m bench.engine_bench --prefix-caching off ...   # engine.prefix_caching off (A/B: no slowdown with it on)
    python -m bench.engine_bench --rows ours_plain,ours_ngram --penalties   # with sampling processors (A/B)
    python -m bench.engine_bench --rows ours_plain,ours_ngram,ours_eagle,ours_eagle_lookup --concurrency 16 \
        --draft-head smollm2-135m-instruct        # a trained EAGLE head (specstream draft train), issue 16

Every row runs in its own subprocess so that its peak RSS is its own, and the
parent prints ratios, which survive a noisy machine better than absolute figures.
Greedy decoding throughout: every greedy row of ours must emit exactly the
tokens of our plain row, which the table reports.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.result_files import default_out
from bench.workloads import ALL, BY_NAME

SINGLE_ROWS = ("ours_plain", "ours_ngram", "ours_draft", "ours_eagle", "ours_eagle_lookup", "hf_generate",
               "hf_prompt_lookup")
CONCURRENT_ROWS = ("ours_plain", "ours_ngram", "ours_eagle_lookup", "hf_padded_batch", "hf_generate_batch")
# Our rows and their speculation method; the eagle rows need --draft-head.
OUR_METHODS = {"ours_plain": None, "ours_ngram": "ngram", "ours_draft": "draft", "ours_eagle": "eagle",
               "ours_eagle_lookup": "eagle_lookup"}


@dataclass
class RowResult:
    row: str
    scenario: str  # "single:<workload>" or "concurrent:<n>"
    new_tokens: int
    seconds: float
    token_ids: dict[str, list[int]] = field(default_factory=dict)
    drafted: int = 0
    accepted: int = 0
    target_forwards: int = 0
    peak_rss_mb: float = 0.0
    # Set when the row was stopped at --row-timeout: tokens/s is then an upper bound.
    timed_out: bool = False
    # Seconds from the start to the first new token (our rows): the rest is decoding, what llama.cpp's
    # predicted_per_second measures (bench.llama_cpp_compare compares both ways).
    first_token_s: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0


# ----------------------------------------------------------------------------- subprocess side


def _prompts(tokenizer, names: list[str]) -> list[list[int]]:
    return [BY_NAME[name].token_ids(tokenizer) for name in names]


def _mixed(n: int) -> list[str]:
    return [ALL[i % len(ALL)].name for i in range(n)]


def _dispatch_line(line: str) -> None:
    """The engine's start line on which kernel runs which step size: to stderr (stdout carries the results)."""
    if line.startswith("kernel dispatch"):
        print(f"    {line}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class OurEngine:
    """How our rows' engine is set up: the command line's --model, --weights, --draft-head, --kernel-dispatch,
    --fused-step, --quant-kernel, --prefix-caching."""

    model: str = "smollm2-135m-instruct"
    weights: str = "fp32"
    draft_head: str | None = None
    kernel_dispatch: str = "auto"
    fused_step: bool = True
    quant_kernel: str = "auto"
    prefix_caching: bool = True
    penalties: bool = False  # our rows decode with repetition/presence/frequency penalties (the processors' cost)

    def args(self) -> list[str]:
        """The same settings as arguments of a row's subprocess."""
        head = ["--draft-head", self.draft_head] if self.draft_head else []
        fused = "on" if self.fused_step else "off"
        return [
            "--model", self.model, "--weights", self.weights, "--kernel-dispatch", self.kernel_dispatch,
            "--fused-step", fused, "--quant-kernel", self.quant_kernel,
            "--prefix-caching", "on" if self.prefix_caching else "off", *head,
            *(["--penalties"] if self.penalties else []),
        ]  # fmt: skip


def _run_ours(method: str | None, workloads: list[str], max_new: int, concurrent: bool, ours: OurEngine) -> list[RowResult]:
    from engine.config import SpeculationConfig, embedded_engine_config
    from engine.llm_engine import LLMEngine
    from engine.loader import resolve_model_dir
    from engine.request import EngineRequest, SamplingOptions

    spec = SpeculationConfig(enabled=method is not None, method="ngram")
    if method in ("eagle", "eagle_lookup"):
        # The adaptive controller decides the draft lengths, as in serving: it must back off where drafting costs.
        spec = SpeculationConfig(method="eagle", draft_head=ours.draft_head, eagle_prompt_lookup=method == "eagle_lookup")
    if method == "draft":
        # A copy of the target as its own draft: full acceptance, the ceiling of the method.
        # Drafting with a copy costs as much as verifying, so the adaptive controller would rightly
        # switch it off; pin k to show what full acceptance buys per target forward.
        spec = SpeculationConfig(
            enabled=True, method="draft", draft_model=str(resolve_model_dir("smollm2-135m-instruct")), adaptive=False
        )
    cfg = embedded_engine_config(
        model=ours.model, speculation=spec, weights=ours.weights, kernel_dispatch=ours.kernel_dispatch,
        fused_step=ours.fused_step, quant_kernel=ours.quant_kernel, prefix_caching=ours.prefix_caching,
    )  # fmt: skip
    engine = LLMEngine.from_config(cfg, progress=_dispatch_line)
    penalties = {"repetition_penalty": 1.1, "presence_penalty": 0.2, "frequency_penalty": 0.2} if ours.penalties else {}
    params = SamplingOptions(max_tokens=max_new, temperature=0.0, ignore_eos=True, **penalties)

    def run(batch: list[tuple[str, list[int]]]) -> tuple[float, dict[str, list[int]], int, int, int, float]:
        for rid, ids in batch:
            engine.add_request(EngineRequest(request_id=rid, prompt_token_ids=ids, sampling=params))
        tokens: dict[str, list[int]] = {rid: [] for rid, _ in batch}
        drafted = accepted = steps = 0
        start, first = time.perf_counter(), 0.0
        while engine.has_unfinished():
            steps += 1
            for out in engine.step():
                tokens[out.request_id].extend(out.token_ids)
                drafted += out.spec.drafted
                accepted += out.spec.accepted
            first = first or (time.perf_counter() - start if any(tokens.values()) else 0.0)
        return time.perf_counter() - start, tokens, drafted, accepted, steps, first

    run([("warmup", _prompts(engine.tokenizer, ["open_question"])[0])])
    results = []
    if concurrent:
        names = workloads
        prompts = _prompts(engine.tokenizer, names)
        secs, toks, d, a, steps, first = run([(f"{i}:{n}", p) for i, (n, p) in enumerate(zip(names, prompts))])
        total = sum(map(len, toks.values()))
        results.append(RowResult("", f"concurrent:{len(names)}", total, secs, toks, d, a, steps, first_token_s=first))
    else:
        for name, prompt in zip(workloads, _prompts(engine.tokenizer, workloads)):
            secs, toks, d, a, steps, first = run([(name, prompt)])
            results.append(RowResult("", f"single:{name}", len(toks[name]), secs, toks, d, a, steps, first_token_s=first))
    return results


def _load_hf():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.loader import resolve_model_dir

    path = resolve_model_dir("smollm2-135m-instruct")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return tok, model


def _hf_generation_config(model, max_new: int, **extra):
    from transformers import GenerationConfig

    # No EOS: every row generates exactly max_new tokens, like ours with ignore_eos.
    return GenerationConfig(
        max_new_tokens=max_new, do_sample=False, eos_token_id=None,
        pad_token_id=model.config.pad_token_id or 0, **extra,
    )


def _run_hf_single(workloads: list[str], max_new: int, prompt_lookup: bool) -> list[RowResult]:
    import torch

    tok, model = _load_hf()
    extra = {"prompt_lookup_num_tokens": 10} if prompt_lookup else {}
    cfg = _hf_generation_config(model, max_new, **extra)
    results = []
    with torch.inference_mode():
        model.generate(torch.tensor([_prompts(tok, ["open_question"])[0]]), generation_config=_hf_generation_config(model, 8))
        for name, prompt in zip(workloads, _prompts(tok, workloads)):
            ids = torch.tensor([prompt])
            start = time.perf_counter()
            out = model.generate(ids, generation_config=cfg)
            secs = time.perf_counter() - start
            new = out[0, len(prompt):].tolist()
            results.append(RowResult("", f"single:{name}", len(new), secs, {name: new}))
    return results


def _run_hf_padded(workloads: list[str], max_new: int) -> list[RowResult]:
    import torch

    tok, model = _load_hf()
    tok.padding_side = "left"
    prompts = _prompts(tok, workloads)
    width = max(map(len, prompts))
    pad = model.config.pad_token_id or 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.inference_mode():
        start = time.perf_counter()
        out = model.generate(ids, attention_mask=mask, generation_config=_hf_generation_config(model, max_new))
        secs = time.perf_counter() - start
    toks = {f"{i}:{n}": out[i, width:].tolist() for i, n in enumerate(workloads)}
    return [RowResult("", f"concurrent:{len(workloads)}", sum(map(len, toks.values())), secs, toks)]


def _run_hf_generate_batch(workloads: list[str], max_new: int) -> list[RowResult]:
    import torch

    tok, model = _load_hf()
    prompts = _prompts(tok, workloads)
    cfg = _hf_generation_config(model, max_new)
    with torch.inference_mode():
        start = time.perf_counter()
        outs = model.generate_batch(inputs=prompts, generation_config=cfg)
        secs = time.perf_counter() - start
    by_prompt = sorted(outs.values(), key=lambda o: prompts.index(list(o.prompt_ids)))
    toks = {f"{i}:{n}": list(o.generated_tokens) for i, (n, o) in enumerate(zip(workloads, by_prompt))}
    return [RowResult("", f"concurrent:{len(workloads)}", sum(map(len, toks.values())), secs, toks)]


def run_row(row: str, scenario: str, max_new: int, ours: OurEngine = OurEngine()) -> list[RowResult]:
    concurrent = scenario.startswith("concurrent:")
    workloads = _mixed(int(scenario.split(":")[1])) if concurrent else [w.name for w in ALL]
    if row.startswith("ours_"):
        results = _run_ours(OUR_METHODS[row], workloads, max_new, concurrent, ours)
    elif row == "hf_generate":
        results = _run_hf_single(workloads, max_new, prompt_lookup=False)
    elif row == "hf_prompt_lookup":
        results = _run_hf_single(workloads, max_new, prompt_lookup=True)
    elif row == "hf_padded_batch":
        results = _run_hf_padded(workloads, max_new)
    elif row == "hf_generate_batch":
        results = _run_hf_generate_batch(workloads, max_new)
    else:
        raise SystemExit(f"unknown row {row!r}")
    for r in results:
        r.row = row
    return results


# ----------------------------------------------------------------------------- parent side


def _spawn(row: str, scenario: str, max_new: int, timeout_s: float, ours: OurEngine) -> list[RowResult]:
    cmd = [sys.executable, "-m", "bench.engine_bench", "--row", row, "--scenario", scenario, "--max-new", str(max_new)]
    cmd += ours.args()
    print(f"  running {row} on {scenario} ...", file=sys.stderr, flush=True)
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(cmd, stdout=out)
        # A row slower than the timeout is killed and reported as an upper bound,
        # so one slow baseline cannot stall the whole comparison.
        timer = threading.Timer(timeout_s, proc.kill)
        timer.start()
        # wait4 reaps the child and returns its own rusage: the row's peak RSS, not the parent's.
        _, status, usage = os.wait4(proc.pid, 0)
        timed_out = not timer.is_alive()
        timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        if timed_out:
            n = 1 if scenario == "single" else int(scenario.split(":")[1])
            print(f"  {row} on {scenario} stopped after {timeout_s:.0f} s", file=sys.stderr, flush=True)
            scenarios = [f"single:{w.name}" for w in ALL] if scenario == "single" else [scenario]
            # Upper bound: as if every token had been generated by the timeout.
            return [
                RowResult(row, sc, n * max_new, timeout_s, peak_rss_mb=usage.ru_maxrss / 1024, timed_out=True)
                for sc in scenarios
            ]
        if proc.returncode != 0:
            raise SystemExit(f"{row} on {scenario} failed with exit code {proc.returncode}")
        out.seek(0)
        rows = [RowResult(**d) for d in json.loads(out.read().strip().splitlines()[-1])]
    for r in rows:
        r.peak_rss_mb = usage.ru_maxrss / 1024
    return rows


def _gemm_gflops() -> float:
    """Measured fp32 GEMM rate of this machine, the denominator of the compute bound."""
    import torch

    a, b = torch.randn(64, 576), torch.randn(576, 1536)
    for _ in range(50):
        a @ b
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < 1.0:
        a @ b
        n += 1
    return 2 * 64 * 576 * 1536 * n / (time.perf_counter() - start) / 1e9


def _identical_to_plain(results: list[RowResult]) -> dict[tuple[str, str], bool]:
    plain = {r.scenario: r.token_ids for r in results if r.row == "ours_plain"}
    return {
        (r.row, r.scenario): r.token_ids == plain.get(r.scenario)
        for r in results if r.row.startswith("ours_") and r.scenario in plain
    }


def report(results: list[RowResult], gemm_gflops: float, params: int, prompt_tokens: dict[str, int]) -> str:
    same = _identical_to_plain(results)
    hf_plain = {r.scenario: r.tokens_per_s for r in results if r.row == "hf_generate"}
    hf_pld = {r.scenario: r.tokens_per_s for r in results if r.row == "hf_prompt_lookup"}
    ours_plain = {r.scenario: r.tokens_per_s for r in results if r.row == "ours_plain"}
    gen_batch = {r.scenario: r.tokens_per_s for r in results if r.row == "hf_generate_batch"}
    lines = [
        "| scenario | row | tokens/s | vs HF plain | vs HF prompt lookup | vs ours plain | vs generate_batch "
        "| acceptance | tokens/forward | same tokens as ours plain | peak RSS MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def ratio(x: float, base: dict[str, float], scenario: str) -> str:
        b = base.get(scenario)
        return f"{x / b:.2f}x" if b else ""

    for r in sorted(results, key=lambda r: (r.scenario, r.row)):
        acc = f"{r.accepted / r.drafted:.2f}" if r.drafted else ""
        per_fwd = ""
        if r.target_forwards:
            seqs = 1 if r.scenario.startswith("single") else int(r.scenario.split(":")[1])
            per_fwd = f"{r.new_tokens / seqs / r.target_forwards:.2f}" if seqs == 1 else ""
        match = same.get((r.row, r.scenario))
        lines.append(
            f"| {r.scenario} | {r.row} | {'< ' if r.timed_out else ''}{r.tokens_per_s:.1f} | {ratio(r.tokens_per_s, hf_plain, r.scenario)} "
            f"| {ratio(r.tokens_per_s, hf_pld, r.scenario)} | {ratio(r.tokens_per_s, ours_plain, r.scenario)} "
            f"| {ratio(r.tokens_per_s, gen_batch, r.scenario)} | {acc} | {per_fwd} "
            f"| {'' if match is None else ('yes' if match else 'NO')} | {r.peak_rss_mb:.0f} |"
        )
    # The bound counts every token the model processes: the prompts' prefill is most
    # of the work at 64 concurrent (~30k prompt tokens against 8k generated).
    flops_per_token = 2 * params
    lines.append("")
    lines.append(
        f"Compute bound: measured fp32 GEMM {gemm_gflops:.1f} GFLOP/s; 2 x {params / 1e6:.0f}M FLOPs per processed "
        f"token (prompt or generated) -> at most {gemm_gflops * 1e9 / flops_per_token:.0f} processed tokens/s."
    )
    lines.append("")
    lines.append("| scenario | row | prompt + new tokens | seconds | seconds at the bound | share of the bound |")
    lines.append("|---|---|---|---|---|---|")
    for r in sorted(results, key=lambda r: (r.scenario, r.row)):
        if not r.row.startswith("ours") or r.timed_out or r.scenario not in prompt_tokens:
            continue
        processed = prompt_tokens[r.scenario] + r.new_tokens
        at_bound = processed * flops_per_token / (gemm_gflops * 1e9)
        lines.append(
            f"| {r.scenario} | {r.row} | {prompt_tokens[r.scenario]} + {r.new_tokens} | {r.seconds:.1f} "
            f"| {at_bound:.1f} | {at_bound / r.seconds:.0%} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from engine.quant.formats import WEIGHT_FORMATS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="32 new tokens; 4 and 8 concurrent")
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--rows", default="", help="comma-separated subset of rows")
    ap.add_argument("--only", choices=("single", "concurrent"), help="run only the batch-1 or the concurrent part")
    ap.add_argument("--concurrency", default="", help="comma-separated concurrent batch sizes (default 16,64; --quick 4,8)")
    ap.add_argument("--out", default=default_out("engine"))
    ap.add_argument("--row-timeout", type=float, default=600.0, help="seconds before a row is stopped (reported as a bound)")
    ap.add_argument(
        "--model", default=OurEngine.model,
        help="engine.model of our rows: a known name or a .gguf file (e.g. llama.cpp's Q4_0 of the same model)",
    )
    ap.add_argument(
        "--weights", default="fp32", choices=WEIGHT_FORMATS, help="engine.weights of our rows"
    )
    ap.add_argument("--draft-head", help="trained EAGLE head (folder or name) for the ours_eagle rows")
    ap.add_argument(
        "--kernel-dispatch", default="auto", choices=("auto", "fixed"),
        help="engine.kernel_dispatch of our rows: auto (measured on this CPU) or fixed (the Intel thresholds)",
    )
    ap.add_argument(
        "--fused-step", default="on", choices=("on", "off"),
        help="engine.fused_step of our rows (int4/int8/bf16): each step's layers as one C++ call, or layer by layer",
    )
    ap.add_argument(
        "--quant-kernel", default="auto", choices=("auto", "torch"),
        help="engine.quant_kernel of our int4/int8 rows: auto (ours, int8 activations, where the CPU has VNNI) or torch",
    )
    ap.add_argument(
        "--prefix-caching", default="on", choices=("on", "off"),
        help="engine.prefix_caching of our rows (the warm-up's prompt and repeated workloads then hit the cache)",
    )
    ap.add_argument("--penalties", action="store_true",
                    help="our rows decode with repetition/presence/frequency penalties (A/B: the processors' cost)")
    ap.add_argument("--row", help=argparse.SUPPRESS)
    ap.add_argument("--scenario", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    ours = OurEngine(
        args.model, args.weights, args.draft_head, args.kernel_dispatch, args.fused_step == "on", args.quant_kernel,
        args.prefix_caching == "on", args.penalties,
    )

    if args.row:  # subprocess mode
        results = run_row(args.row, args.scenario, args.max_new, ours)
        print(json.dumps([asdict(r) for r in results]))
        return 0

    max_new = 32 if args.quick else args.max_new
    concurrency = tuple(int(n) for n in args.concurrency.split(",") if n) or ((4, 8) if args.quick else (16, 64))
    wanted = set(filter(None, args.rows.split(",")))
    plan = [(row, "single") for row in SINGLE_ROWS] + [
        (row, f"concurrent:{n}") for n in concurrency for row in CONCURRENT_ROWS
    ]
    plan = [(r, s) for r, s in plan if (not wanted or r in wanted) and (not args.only or s.startswith(args.only))]
    if not args.draft_head:  # the eagle rows need a trained head
        plan = [(r, s) for r, s in plan if "eagle" not in r]
    print(f"engine benchmark: {len(plan)} runs, {max_new} new tokens, greedy", file=sys.stderr)
    results: list[RowResult] = []
    for row, scenario in plan:
        results.extend(_spawn(row, scenario, max_new, args.row_timeout, ours))

    from transformers import AutoConfig

    from engine.loader import resolve_model_dir
    from engine.model_text import load_tokenizer

    cfg = AutoConfig.from_pretrained(resolve_model_dir(ours.model))
    params = _count_params(cfg)
    tokenizer = load_tokenizer(ours.model)
    prompt_tokens = {f"single:{w.name}": len(_prompts(tokenizer, [w.name])[0]) for w in ALL}
    prompt_tokens.update({f"concurrent:{n}": sum(map(len, _prompts(tokenizer, _mixed(n)))) for n in concurrency})
    text = report(results, _gemm_gflops(), params, prompt_tokens)
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"max_new": max_new, "results": [asdict(r) for r in results], "table": text}, indent=1))
    print(f"\nresults written to {out}", file=sys.stderr)
    return 0


def _count_params(cfg) -> int:
    """Parameters touched per token (embedding lookup excluded, LM head included)."""
    h, i, layers, v = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    head_dim = getattr(cfg, "head_dim", None) or h // cfg.num_attention_heads  # Gemma's is its own (256)
    q, kv = cfg.num_attention_heads * head_dim, cfg.num_key_value_heads * head_dim
    per_layer = h * q * 2 + h * kv * 2 + 3 * h * i
    return layers * per_layer + h * v


if __name__ == "__main__":
    raise SystemExit(main())
