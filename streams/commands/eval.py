"""`specstream eval replay|run`: the command line of evaluation.

    specstream eval replay (--since 2h | --from-offset N) (--candidate FILE.yaml | --target-prefix P)
                           [--tenant T] [--limit N] [--references FILE.jsonl | --references-topic]
                           [--out DIR] [gates ...]
    specstream eval run --samples FILE.jsonl [--max-tokens N] [--target-prefix P] [--out DIR] [gates ...]
    specstream eval run --lm-eval [TASK,...] [--hf] [--limit N] [--base-url URL] [--api-key KEY] [--out DIR]

The report goes to stdout as JSON (and to DIR as report.json, summary.png, report.html with --out); a one-line
summary per gate goes to stderr. Exit status: 0 every gate passed, 1 a gate failed, 2 a bad configuration (the
candidate's included), 3 the evaluation could not run (nothing to replay, the candidate did not start, Kafka
unreachable).

With --lm-eval, lm-evaluation-harness runs its tasks against the edge (streams.eval.harness) and stdout gets its
tables; with --hf also lm-eval's hf model's, and exit status 1 when a metric differs by more than its stderr.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from aiokafka.errors import KafkaError

from streams.config import ConfigError, Settings, load_settings
from streams.eval.gates import add_gate_options, check_gates, gate_section
from streams.eval.harness import BUNDLED_TASKS
from streams.eval.source import SourceError

EXIT_GATE_FAILED = 1
EXIT_CONFIG = 2
EXIT_CANNOT_RUN = 3
_RUN_GATES = ("min-reference-exact-match", "min-token-f1", "max-error-rate")
# Options of one kind of `eval run` only (refused with the other).
_SAMPLES_ONLY = ("max-tokens", "target-prefix", "reply-prefix", *_RUN_GATES)
_HARNESS_ONLY = ("base-url", "api-key", "model", "limit", "hf")


def add_eval_commands(commands: Any) -> None:
    evaluate = commands.add_parser("eval", help="replay recorded requests against a candidate; score eval samples")
    actions = evaluate.add_subparsers(dest="eval_action", required=True, metavar="ACTION")

    replay = actions.add_parser("replay", help="replay recorded completions against a candidate and compare")
    start = replay.add_mutually_exclusive_group(required=True)
    start.add_argument("--since", metavar="DURATION", help="records of the last 30m, 2h, 1d, ...")
    start.add_argument("--from-offset", type=int, metavar="N", help="records from this offset of the completions topic")
    target = replay.add_mutually_exclusive_group(required=True)
    target.add_argument("--candidate", type=Path, metavar="FILE", help="start a candidate worker with this config")
    target.add_argument("--target-prefix", metavar="P", help="replay to a worker group already serving prefix P")
    replay.add_argument("--tenant", help="only this tenant's requests")
    replay.add_argument("--limit", type=int, help="at most N requests (the first ones)")
    refs = replay.add_mutually_exclusive_group()
    refs.add_argument("--references", type=Path, metavar="FILE", help="reference answers (JSONL samples)")
    refs.add_argument("--references-topic", action="store_true", help="reference answers from <prefix>.eval-samples")
    replay.add_argument("--ready-timeout", type=float, default=900.0, help="seconds for the candidate to load (900)")
    _common(replay)
    add_gate_options(replay)
    replay.set_defaults(handler=cmd_replay)

    run = actions.add_parser("run", help="score the deployment serving now: eval samples on the bus, or "
                             "lm-evaluation-harness tasks through the edge")
    what = run.add_mutually_exclusive_group(required=True)
    what.add_argument("--samples", type=Path, metavar="FILE", help="JSONL: input, reference, tags")
    what.add_argument("--lm-eval", nargs="?", const=",".join(BUNDLED_TASKS), metavar="TASKS",
                      help="lm-evaluation-harness tasks, comma-separated, through the edge's OpenAI API (alone: the "
                      f"bundled {','.join(BUNDLED_TASKS)}); prints lm-eval's table")
    run.add_argument("--max-tokens", type=int, help="per sample (default: edge.max_tokens_default)")
    run.add_argument("--target-prefix", metavar="P", help="score the deployment on prefix P (default: kafka.topic_prefix)")
    _common(run)
    add_gate_options(run, flags=_RUN_GATES)
    harness = run.add_argument_group("with --lm-eval (docs/eval.md)")
    harness.add_argument("--base-url", help="the edge's URL (default: the config's edge host and port)")
    harness.add_argument("--api-key", help="default: $SPECSTREAM_API_KEY, else $OPENAI_API_KEY, else the local key")
    harness.add_argument("--model", help="the served model (default: engine.model)")
    harness.add_argument("--limit", type=int, metavar="N", help="the first N items of each task")
    harness.add_argument("--hf", action="store_true", help="also score lm-eval's hf model on the same weights and "
                         "compare; exit 1 when a metric differs by more than its stderr")
    harness.add_argument("--hf-device", default="cpu", help="the hf model's device (cpu)")
    harness.add_argument("--hf-dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                         help="the hf model's dtype (float32)")
    run.set_defaults(handler=cmd_run)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--concurrency", type=int, default=4, help="requests outstanding at once (4)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for each answer (300)")
    parser.add_argument("--out", type=Path, metavar="DIR", help="also write report.json, summary.png, report.html here")
    parser.add_argument("--reply-prefix", metavar="P", help="answers on P.replies.eval-* (default: kafka.topic_prefix, "
                        "which rollout candidate pools accept; a group on its own prefix: that prefix)")


def cmd_replay(args: argparse.Namespace, settings: Settings) -> int:
    from schemas.events import CompletionRecord
    from streams.eval.replay import ReplayPlan, replay
    from streams.eval.source import parse_duration, read_topic, select_records

    try:
        candidate_settings = load_settings(args.candidate) if args.candidate is not None else settings
        since_s = parse_duration(args.since) if args.since else None
        references = _references(args, settings)
        kafka = settings.kafka
        read = asyncio.run(read_topic(kafka, settings.catalog.completions.name, CompletionRecord,
                                      since_s=since_s, from_offset=args.from_offset))
    except ConfigError as error:
        _progress(f"config error: {error}")
        return EXIT_CONFIG
    except (SourceError, KafkaError) as error:
        return _cannot_run(str(error))
    selection = select_records(read, tenant=args.tenant, limit=args.limit)
    if not selection.records:
        return _cannot_run(f"nothing to replay in {settings.catalog.completions.name}: {selection.counts()}")
    plan = ReplayPlan(settings=settings, selection=selection, candidate_config=args.candidate,
                      candidate_settings=candidate_settings, target_prefix=args.target_prefix,
                      concurrency=args.concurrency, timeout_s=args.timeout, ready_timeout_s=args.ready_timeout,
                      references=references, reply_prefix=args.reply_prefix or settings.kafka.topic_prefix)
    return _finish(args, lambda: replay(plan, _progress))


def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    if args.lm_eval is not None:
        return cmd_lm_eval(args, settings)
    given = [f"--{flag}" for flag in _HARNESS_ONLY if getattr(args, flag.replace("-", "_")) not in (None, False)]
    if given:
        _progress(f"config error: {', '.join(given)} go with --lm-eval, not --samples")
        return EXIT_CONFIG
    from streams.eval.run import run_samples
    from streams.eval.source import load_samples

    try:
        samples = load_samples(args.samples)
    except SourceError as error:
        return _cannot_run(str(error))
    prefix = settings.kafka.topic_prefix
    max_tokens = args.max_tokens or settings.edge.max_tokens_default
    return _finish(args, lambda: run_samples(
        settings, samples, target_prefix=args.target_prefix or prefix, reply_prefix=args.reply_prefix or prefix,
        max_tokens=max_tokens, concurrency=args.concurrency, timeout_s=args.timeout, progress=_progress))


def cmd_lm_eval(args: argparse.Namespace, settings: Settings) -> int:
    """lm-eval's tasks through the edge (and lm-eval's hf model with --hf): tables on stdout; 1 when they differ."""
    given = [f"--{flag}" for flag in _SAMPLES_ONLY if getattr(args, flag.replace("-", "_")) is not None]
    if given:
        _progress(f"config error: {', '.join(given)} go with --samples, not --lm-eval")
        return EXIT_CONFIG
    tasks = [t.strip() for t in args.lm_eval.split(",") if t.strip()]
    if not tasks or (args.limit is not None and args.limit < 1):
        _progress("config error: --lm-eval needs task names, and --limit a positive number")
        return EXIT_CONFIG
    if all(t in BUNDLED_TASKS for t in tasks):  # their data is beside them: nothing to fetch
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from streams.eval import harness

    model = args.model or settings.engine.model
    try:
        loaded = harness.load_tasks(tasks)
        tokenizer, weights = harness.model_files(model, _progress)
        target = harness.EdgeTarget(
            base_url=args.base_url or harness.edge_url(settings), model=model, tokenizer=tokenizer,
            api_key=harness.api_key(args.api_key, settings, os.environ), max_length=harness.model_context(settings, model),
            concurrency=args.concurrency, timeout_s=args.timeout)
        hf = dataclasses.replace(weights, device=args.hf_device, dtype=args.hf_dtype) if args.hf else None
        report = harness.run_harness(loaded, target, hf=hf, limit=args.limit, progress=_progress)
    except harness.HarnessError as error:
        return _cannot_run(str(error))
    except Exception as error:  # noqa: BLE001 - lm-eval's own failures (the edge unreachable, a refused request)
        return _cannot_run(f"lm-eval failed: {type(error).__name__}: {str(error)[:500]}")
    print(f"## edge: {target.base_url} ({model})\n\n{harness.results_table(report.edge)}\n")
    if report.hf is not None:
        print(f"## lm-eval hf: {weights.pretrained} ({args.hf_dtype}, {args.hf_device})\n\n"
              f"{harness.results_table(report.hf)}\n")
    print(f"## comparison\n\n{harness.table(report.rows)}\n")
    for task, closeness in report.items.items():
        print(f"{task}: {closeness}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / "lm_eval.json"
        path.write_text(json.dumps({"tasks": tasks, "model": model, "edge": report.edge, "hf": report.hf,
                                    "comparison": [dataclasses.asdict(r) | {"agrees": r.agrees} for r in report.rows],
                                    "items": report.items}, indent=2, default=str))
        _progress(f"wrote {path}")
    if report.hf is not None:
        _progress("every metric agrees with lm-eval's hf model within stderr" if report.agrees else
                  "FAIL: a metric differs from lm-eval's hf model by more than its stderr")
    return 0 if report.agrees else EXIT_GATE_FAILED


def _references(args: argparse.Namespace, settings: Settings) -> dict[str, tuple[str, tuple[str, ...]]]:
    from schemas.events import EvalSample
    from streams.eval.source import input_key, load_samples, read_topic

    if args.references is not None:
        samples = load_samples(args.references)
    elif args.references_topic:
        samples = asyncio.run(read_topic(settings.kafka, settings.catalog.eval_samples.name,
                                         EvalSample)).events
    else:
        return {}
    return {input_key(s.prompt, s.messages): (s.reference, tuple(s.tags)) for s in samples if s.reference is not None}


def _finish(args: argparse.Namespace, work: Callable[[], Coroutine[Any, Any, dict[str, Any]]]) -> int:
    """Run the evaluation, add the gates, write the report; the exit status says whether every gate passed."""
    from streams.eval.candidate import CandidateError
    from streams.eval.report import write_reports

    try:
        report = asyncio.run(work())
    except (KafkaError, CandidateError, OSError) as error:
        return _cannot_run(f"{type(error).__name__}: {error}")
    results = check_gates(args, report)
    report["gates"] = gate_section(results)
    print(json.dumps(report, indent=2))
    if args.out is not None:
        for path in write_reports(report, args.out):
            _progress(f"wrote {path}")
    for result in results:
        _progress(result.describe())
    return 0 if report["gates"]["passed"] else EXIT_GATE_FAILED


def _progress(line: str) -> None:
    print(f"eval: {line}", file=sys.stderr, flush=True)


def _cannot_run(message: str) -> int:
    _progress(f"error: {message}")
    return EXIT_CANNOT_RUN
