"""One `specstream draft train` run: data, one target pass, training, held-out acceptance, the artifact.

Every phase says how far it got (long work shows progress) and how long it
took; the figures go into the head's config.json and the printed report.
"""
from __future__ import annotations

import asyncio
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from streams.config import Settings
from streams.draft.prompts import builtin_prompts
from streams.draft.source import (
    Progress,
    Sequence,
    chat_prompt_ids,
    from_completions_log,
    generate,
)


@dataclass
class DraftTrainOptions:
    name: str = "default"
    topic: str | None = None  # the completions topic to read; None: generate only
    # The recipe measured in docs/performance.md (2026-12-04): more distinct answers, fewer epochs. 2,900
    # answers for 2 epochs gave held-out first-draft acceptance 0.48 where 1,000 for 5 epochs gave 0.42.
    samples: int = 2900  # training sequences wanted in all
    generate: int = 2900  # at most this many generated when the log gives fewer than `samples`
    max_new_tokens: int = 128  # per generated answer
    epochs: int = 2
    # Draft depths trained on the head's own outputs (engine.speculative.eagle_train.TrainConfig): 3 raised held-out
    # acceptance at positions 2-6 by 0.06-0.28 for 0.04 at the first (54e26a1:docs/benchmarks.md), at 2.7x the
    # training time.
    rollout: int = 3
    # A sequences.json an earlier run kept: train on exactly its data (no log read, no generation).
    sequences: Path | None = None
    draft_vocab_size: int = 8192
    holdout: float = 0.1
    holdout_max: int = 100  # held-out sequences at most: 100 measure acceptance to ~0.01 in ~2 CPU minutes
    eval_k: int = 6  # drafts per start when measuring acceptance by position
    eval_stride: int = 2  # every n-th position of a held-out completion is a start
    out_root: Path | None = None  # default: engine.speculative.eagle_artifact.default_root()
    seed: int = 0


@dataclass
class DraftTrainReport:
    head: str
    log: dict[str, int] = field(default_factory=dict)
    sequences: int = 0
    generated: int = 0
    train_tokens: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    acceptance_by_position: list[float] = field(default_factory=list)
    expected_tokens_per_step: float = 0.0


def run_training(settings: Settings, options: DraftTrainOptions, progress: Progress) -> DraftTrainReport:
    from engine.loader import load_model

    timer = _Timer()
    engine_cfg = settings.engine
    loaded = load_model(engine_cfg.model, device=engine_cfg.device, dtype=engine_cfg.dtype, progress=progress)
    served = _served_target(settings, progress)
    timer.lap("load")
    if options.sequences is not None:
        sequences, generated = _kept_sequences(options.sequences), []
        log_counts = {"kept": len(sequences)}
    else:
        sequences, log_counts = _log_sequences(settings, options, served, progress)
        timer.lap("read_log")
        wanted = min(options.generate, options.samples - len(sequences))
        generated = _generated(served, wanted, options, progress) if wanted > 0 else []
        timer.lap("generate")
        sequences += generated
        _keep_sequences(sequences, options)
    if len(sequences) < 2:
        raise ValueError(f"only {len(sequences)} training sequences (log and generation): need at least 2")
    head, meta, report = _train_and_measure(loaded, served.model, sequences, options, progress, timer)
    report.log, report.generated = log_counts, len(generated)
    meta.train.update({"log": log_counts, "generated": len(generated), "seconds": dict(timer.laps),
                       "weights": served.weight_format})
    report.seconds = dict(timer.laps)
    report.head = str(_save(head, meta, options))
    return report


def _served_target(settings: Settings, progress: Progress) -> Any:
    """The target as the head will be served beside it: an engine (speculation off) in engine.weights, on a copy
    of the model of its own, since the engine converts its model's weights in place and the head starts from,
    and binds to, the loaded fp32 weights. It generates the answers and runs the target pass, so the features
    and labels the head learns are those of the format it serves (bf16 and int4 also run 4-6x faster than fp32
    here)."""
    from engine.config import LoRAConfig, SpeculationConfig
    from engine.llm_engine import LLMEngine
    from engine.loader import load_model

    engine_cfg = settings.engine
    copy = load_model(engine_cfg.model, device=engine_cfg.device, dtype=engine_cfg.dtype)
    cfg = engine_cfg.model_copy(update={"max_running_requests": 32, "lora": LoRAConfig(max_loaded=0),
                                        "speculation": SpeculationConfig(enabled=False)})
    engine = LLMEngine(copy, cfg)
    progress(f"the target serves as weights {engine.weight_format}: it generates and runs the target pass")
    return engine


def _log_sequences(
    settings: Settings, options: DraftTrainOptions, served: Any, progress: Progress
) -> tuple[list[Sequence], dict[str, int]]:
    if options.topic is None:
        return [], {}
    topic = settings.catalog.completions.name if options.topic == "completions" else options.topic
    from streams.eval.source import SourceError

    progress(f"reading {topic} from its beginning ...")
    try:
        # At most the served context: the target pass runs on the served engine's RoPE tables.
        got = asyncio.run(from_completions_log(settings.kafka, topic, served.tokenizer, limit=options.samples,
                                               max_len=served.max_model_len))
    except SourceError as error:  # no such topic yet: nothing recorded, which generation makes up for
        progress(f"no log to read: {error}")
        return [], {}
    progress(f"{len(got.sequences)} usable records in {topic} ({got.counts})")
    return got.sequences, got.counts


def _generated(served: Any, n: int, options: DraftTrainOptions, progress: Progress) -> list[Sequence]:
    progress(f"the log is thin: generating {n} answers with the target ({options.max_new_tokens} tokens at most)")
    prompts = [chat_prompt_ids(served.tokenizer, p) for p in builtin_prompts(n, options.seed)]
    return generate(served, prompts, options.max_new_tokens, progress)


def _train_and_measure(loaded: Any, served_model: Any, sequences: list[Sequence], options: DraftTrainOptions,
                       progress: Progress, timer: _Timer) -> tuple[Any, Any, DraftTrainReport]:
    from engine.speculative.eagle_artifact import HeadMeta
    from engine.speculative.eagle_eval import acceptance_by_position
    from engine.speculative.eagle_head import target_fingerprint
    from engine.speculative.eagle_train import TrainConfig, collect_features, train_head

    random.Random(options.seed).shuffle(sequences)
    n_hold = max(1, min(int(len(sequences) * options.holdout), options.holdout_max))
    examples = collect_features(served_model, sequences, progress)
    held, train = examples[:n_hold], examples[n_hold:]
    timer.lap("target_pass")
    cfg = TrainConfig(epochs=options.epochs, draft_vocab_size=options.draft_vocab_size, rollout=options.rollout,
                      seed=options.seed)
    head, figures = train_head(loaded.model, train, cfg, progress)
    timer.lap("train")
    acc = acceptance_by_position(head, loaded.model, held, options.eval_k, progress, stride=options.eval_stride)
    timer.lap("evaluate")
    tokens = sum(len(e.tokens) for e in train)
    meta = HeadMeta(
        target_model=loaded.name, target_fingerprint=target_fingerprint(loaded.model),
        hidden_size=loaded.model.cfg.hidden_size, draft_vocab_size=head.vocab_size,
        version=time.strftime("%Y%m%d-%H%M%S", time.gmtime()),
        train={"sequences": len(train), "held_out": len(held), "tokens": tokens, "epochs": options.epochs,
               "rollout": options.rollout,
               **figures, "acceptance_tested": acc.tested},
        acceptance_by_position=[round(p, 4) for p in acc.by_position()],
    )
    report = DraftTrainReport(head="", sequences=len(sequences), train_tokens=tokens,
                              acceptance_by_position=meta.acceptance_by_position,
                              expected_tokens_per_step=round(acc.expected_tokens(), 3))
    return head, meta, report


def _save(head: Any, meta: Any, options: DraftTrainOptions) -> Path:
    from engine.speculative.eagle_artifact import default_root, save_head

    root = options.out_root or default_root()
    return save_head(root / options.name / meta.version, head, meta)


def _keep_sequences(sequences: list[Sequence], options: DraftTrainOptions) -> None:
    """The training sequences next to the heads (sequences.json): generation is the slow part of a run,
    and they let a later run retrain or compare heads on the same data."""
    import json

    from engine.speculative.eagle_artifact import default_root

    folder = (options.out_root or default_root()) / options.name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sequences.json").write_text(json.dumps([{"tokens": t, "num_prompt_tokens": n} for t, n in sequences]))


def _kept_sequences(path: Path) -> list[Sequence]:
    """The sequences an earlier run kept (_keep_sequences), in the order it kept them: the same
    held-out slice follows from the same seed, so heads trained on them compare like for like."""
    import json

    try:
        rows = json.loads(path.read_text())
        return [([int(t) for t in row["tokens"]], int(row["num_prompt_tokens"])) for row in rows]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path}: not a sequences.json of draft train ({error})") from error


class _Timer:
    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._t = time.perf_counter()
        self._start = self._t

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = round(now - self._t, 1)
        self.laps["total"] = round(now - self._start, 1)
        self._t = now


def report_dict(report: DraftTrainReport) -> dict[str, Any]:
    return asdict(report)
