"""Where a running batch puts an interactive request's first token: one engine, no Kafka (issue 18).

    python -m bench.batch_steps --threads 1            # ~2 min: interactive alone, then beside a batch
    python -m bench.batch_steps --threads 2 --requests 30
    python -m bench.batch_steps --compositions          # forward time by step composition, 1 and 2 threads

One engine (SmolLM2-135M, fp32, the batch bench's settings: max_running_requests 16, batch_max_share 0.5) driven
the way the worker's engine thread drives it: requests are added between steps only. Two phases on one arrival
schedule (open loop, Poisson at --rate, chat prompts of ``specstream bench --workload chat``): interactive requests
alone, then the same with --batch-lines batch lines (priority 10) held in the engine throughout (a finished line
is replaced at once, as the worker's batch lane does).

Per interactive request its first token splits into: **intake**, the wait for the step in flight when it arrived
(arrival -> first scheduled), and **own step**, its prefill step (first scheduled -> first token). Per step: wall
time by composition (steps with interactive prefill and the batch rows they carry; batch-only steps and their
tokens). What Kafka, the edge and the client add comes on top (the batch bench's client_minus_server figures).
--compositions times the target forward alone (no scheduling, sampling or detokenizing) for fixed step
compositions, alternated round robin at 1 and 2 torch threads, so that a loaded machine moves them alike.
Only ratios between rows of one run mean anything on a shared machine.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import dataclass, field
from itertools import accumulate, count

import torch

from bench.batch_bench import batch_prompts
from engine.config import embedded_engine_config
from engine.llm_engine import LLMEngine
from engine.request import EngineRequest, SamplingOptions
from engine.scheduler import ScheduledSequence, SchedulerOutput
from engine.sequence import Sequence
from engine.speculative.proposer import DraftProposal
from engine.step_record import StepRecord
from schemas.batch import BATCH_PRIORITY
from streams.bench.stats import percentile
from streams.bench.workload import LengthSpec, synthetic


@dataclass
class Phase:
    """What one phase measured (seconds)."""

    intake: list[float] = field(default_factory=list)
    own_step: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    # (kind, wall s, interactive prefill tokens, batch rows, total rows) per step
    steps: list[tuple[str, float, int, int, int]] = field(default_factory=list)
    batch_tokens: int = 0
    interactive_tokens: int = 0
    wall_s: float = 0.0


def chat_prompts(engine: LLMEngine, n: int) -> list[list[int]]:
    requests = synthetic("chat", LengthSpec(output_len=1), seed=1)
    out = []
    for _ in range(n):
        messages = list(next(requests).messages or ())
        text = engine.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        out.append(list(engine.tokenizer(text, add_special_tokens=False)["input_ids"]))
    return out


def step_kind(record: StepRecord) -> str:
    if record.interactive_prefill_tokens:
        return "interactive prefill"
    return "interactive decode" if record.interactive_decode_rows else "batch only"


class Driver:
    """The worker's engine thread in miniature: adds due requests between steps, then steps."""

    def __init__(self, engine: LLMEngine, args: argparse.Namespace) -> None:
        self.engine, self.args = engine, args
        self.phase = Phase()
        engine.add_step_observer(self.observe)
        self.batch_texts = batch_prompts(10_000)
        self.ids = count()
        self.batch_live: set[str] = set()

    def observe(self, record: StepRecord) -> None:
        """The step's composition and wall time, into the phase running now."""
        if not record.is_empty:
            step = (step_kind(record), record.wall_s, record.interactive_prefill_tokens, record.batch_rows,
                    record.num_rows)
            self.phase.steps.append(step)

    def add_batch_line(self) -> None:
        i = next(self.ids)
        ids = list(self.engine.tokenizer(self.batch_texts[i % len(self.batch_texts)])["input_ids"])
        sampling = SamplingOptions(max_tokens=self.args.output_len)
        self.engine.add_request(EngineRequest(f"b{i}", ids, sampling, priority=BATCH_PRIORITY))
        self.batch_live.add(f"b{i}")

    def run(self, prompts: list[list[int]], arrivals: list[float], with_batch: bool) -> Phase:
        self.phase = phase = Phase()
        engine, t0 = self.engine, time.time()
        due = [(t0 + at, f"i{n}", p) for n, (at, p) in enumerate(zip(arrivals, prompts))]
        pending: set[str] = set()
        while due or pending:
            while due and due[0][0] <= time.time():
                at, rid, prompt = due.pop(0)
                sampling = SamplingOptions(max_tokens=self.args.output_len)
                engine.add_request(EngineRequest(rid, prompt, sampling, arrival_time=at))
                pending.add(rid)
            while with_batch and len(self.batch_live) < self.args.batch_lines:
                self.add_batch_line()
            if not engine.has_unfinished():
                time.sleep(max(0.0, due[0][0] - time.time()))
                continue
            for out in engine.step():
                batch = out.request_id.startswith("b")
                if batch:
                    phase.batch_tokens += len(out.token_ids)
                else:
                    phase.interactive_tokens += len(out.token_ids)
                if not out.finished:
                    continue
                if batch:
                    self.batch_live.discard(out.request_id)
                elif out.stats is not None:
                    pending.discard(out.request_id)
                    phase.intake.append(out.stats.queued_s)
                    phase.ttft.append(out.stats.ttft_s)
                    phase.own_step.append(out.stats.ttft_s - out.stats.queued_s)
        for rid in self.batch_live:
            engine.abort(rid)  # the batch lines still held: the next phase starts empty
        self.batch_live.clear()
        phase.wall_s = time.time() - t0
        return phase


def pct(xs: list[float], q: float) -> float:
    """The q-quantile (0..1) of seconds, in milliseconds, as `specstream bench` computes percentiles."""
    return percentile(xs, q * 100) * 1000


def report(name: str, phase: Phase) -> None:
    print(f"\n## {name}: {len(phase.ttft)} interactive requests, {phase.wall_s:.0f} s, "
          f"interactive {phase.interactive_tokens / phase.wall_s:.1f} tok/s, batch {phase.batch_tokens / phase.wall_s:.1f} tok/s")
    print("| interactive first token (ms) | p50 | p90 | p99 | max |\n|---|---|---|---|---|")
    for label, xs in (("intake (step in flight)", phase.intake), ("own prefill step", phase.own_step),
                      ("TTFT in the engine", phase.ttft)):
        print(f"| {label} | {pct(xs, .5):.0f} | {pct(xs, .9):.0f} | {pct(xs, .99):.0f} | {max(xs) * 1000:.0f} |")
    print("| step kind | steps | ms p50 | ms p90 | interactive prefill tokens | batch rows | rows |\n|---|---|---|---|---|---|---|")
    for kind in ("interactive prefill", "interactive decode", "batch only"):
        rows = [s for s in phase.steps if s[0] == kind]
        if rows:
            walls = [s[1] for s in rows]
            means = [statistics.fmean(s[i] for s in rows) for i in (2, 3, 4)]
            print(f"| {kind} | {len(rows)} | {pct(walls, .5):.0f} | {pct(walls, .9):.0f} | "
                  f"{means[0]:.1f} | {means[1]:.1f} | {means[2]:.1f} |")


def fixed_seq(engine: LLMEngine, rid: str, prompt_len: int, decoding: bool) -> Sequence:
    """A sequence holding a KV region, either before its prompt or decoding right after it (KV contents do not
    change a forward's cost)."""
    seq = Sequence(EngineRequest(rid, [100 + i for i in range(prompt_len)], SamplingOptions(max_tokens=64)))
    seq.kv = engine.kv_cache.allocate(seq.kv_tokens_needed(engine.max_draft_tokens))
    if seq.kv is None:
        raise RuntimeError("KV cache too small for the compositions")
    if decoding:
        seq.kv.num_cached = prompt_len
        seq.output_ids.append(7)
    return seq


def compositions(engine: LLMEngine) -> dict[str, SchedulerOutput]:
    """The steps an interactive request meets: alone, and beside 8 decoding batch lines."""
    batch = [fixed_seq(engine, f"b{i}", 20, decoding=True) for i in range(8)]
    prefill = fixed_seq(engine, "i-prefill", 45, decoding=False)
    decode = fixed_seq(engine, "i-decode", 45, decoding=True)
    extra = fixed_seq(engine, "b-prompt", 32, decoding=False)

    def rows(*parts: list[ScheduledSequence]) -> SchedulerOutput:
        return SchedulerOutput([s for part in parts for s in part], [])

    def decodes(seqs: list[Sequence], k: int = 0) -> list[ScheduledSequence]:
        out = []
        for seq in seqs:
            sched = ScheduledSequence(seq, 1, is_prefill=False, needs_logits=True, draft_budget=k)
            sched.set_drafts(DraftProposal(tokens=[9] * k))
            out.append(sched)
        return out

    def chunk(seq: Sequence, n: int) -> list[ScheduledSequence]:
        return [ScheduledSequence(seq, n, is_prefill=True, needs_logits=n == seq.num_prompt_tokens)]

    return {
        "interactive prefill (45)": rows(chunk(prefill, 45)),
        "interactive prefill + 8 batch rows": rows(chunk(prefill, 45), decodes(batch)),
        "interactive decode (1 row)": rows(decodes([decode])),
        "interactive decode + 8 batch rows": rows(decodes([decode]), decodes(batch)),
        "8 batch rows": rows(decodes(batch)),
        "8 batch rows + 8 prompt tokens": rows(decodes(batch), chunk(extra, 8)),
        "8 batch rows + 32 prompt tokens": rows(decodes(batch), chunk(extra, 32)),
        "8 batch rows + 32 drafts (k=4)": rows(decodes(batch, 4)),
    }


def time_compositions(engine: LLMEngine, rounds: int, threads: list[int]) -> None:
    steps = compositions(engine)
    times: dict[tuple[str, int], list[float]] = {(name, t): [] for name in steps for t in threads}
    for _ in range(rounds):
        for t in threads:
            torch.set_num_threads(t)
            for name, batch in steps.items():
                start = time.perf_counter()
                engine.runner.execute(batch)
                times[(name, t)].append(time.perf_counter() - start)
    head = " | ".join(f"{t} thr p50 | {t} thr p90" for t in threads)
    print(f"| step composition (forward only, ms; {rounds} rounds) | rows | {head} |")
    print("|---|---|" + "---|---|" * len(threads))
    for name, batch in steps.items():
        cells = " | ".join(f"{pct(times[(name, t)], .5):.0f} | {pct(times[(name, t)], .9):.0f}" for t in threads)
        print(f"| {name} | {batch.num_batched_tokens} | {cells} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--requests", type=int, default=40, help="interactive requests per phase")
    p.add_argument("--rate", type=float, default=1.0, help="interactive requests per second (Poisson)")
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--batch-lines", type=int, default=8, help="batch lines held in the engine (batch.worker_slots)")
    p.add_argument("--batch-step-tokens", type=int, default=32)
    p.add_argument("--compositions", action="store_true", help="time fixed step compositions instead")
    p.add_argument("--rounds", type=int, default=30, help="rounds of --compositions")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    engine = LLMEngine.from_config(embedded_engine_config(max_running_requests=16, batch_max_share=0.5, kv_cache_bytes=256 << 20,
                                                batch_step_tokens=args.batch_step_tokens))
    if args.compositions:
        time_compositions(engine, args.rounds, [1, 2])
        return 0
    rng = random.Random(1)
    arrivals = list(accumulate(rng.expovariate(args.rate) for _ in range(args.requests)))
    prompts = chat_prompts(engine, args.requests)
    driver = Driver(engine, args)
    driver.run(prompts[:4], [0.0, 0.3, 0.6, 0.9], with_batch=True)  # warm-up
    print(f"torch threads {torch.get_num_threads()}, chat prompts {statistics.fmean(map(len, prompts)):.0f} tokens")
    alone = driver.run(prompts, arrivals, with_batch=False)
    mixed = driver.run(prompts, arrivals, with_batch=True)
    report("alone", alone)
    report(f"beside {args.batch_lines} batch lines", mixed)
    print(f"\np99 TTFT ratio (engine only): {pct(mixed.ttft, .99) / pct(alone.ttft, .99):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
