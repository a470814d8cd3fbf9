"""`specstream eval run --lm-eval TASK ...`: lm-evaluation-harness (PyPI ``lm_eval``) against the edge.

lm-eval is the client: its ``local-completions`` model scores log-likelihood tasks (multiple choice, perplexity)
through ``/v1/completions`` (the prompt as token ids, ``echo`` with ``logprobs``), its ``local-chat-completions``
model runs generation tasks through ``/v1/chat/completions`` (the chat template applied by the edge's worker).
Optionally (``--hf``) lm-eval's own ``hf`` model scores the same tasks on the same weights in this process, in
fp32 on the CPU by default, and each metric is compared: the two agree when they differ by no more than the larger
of the two standard errors lm-eval reports.

Tasks are lm-eval task names, or the two bundled here (``streams/eval/lm_eval_tasks``), which read their JSONL
beside them and never touch the hub: ``specstream_mc`` (multiple choice, acc) and ``specstream_gen`` (generation,
exact match). The weights for ``--hf``: a GGUF model (the default one) is transformers' own dequantisation of
the file, saved once as a model folder (engine.loader.convert_gguf, as our worker makes it); a model folder is given
as it is.
"""
from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

TASKS_DIR = Path(__file__).resolve().parent / "lm_eval_tasks"
BUNDLED_TASKS = ("specstream_mc", "specstream_gen")
# lm-eval's output types: what is scored from logprobs (local-completions) and what is generated.
_SCORED_TYPES = frozenset({"loglikelihood", "multiple_choice", "loglikelihood_rolling"})
# Entries of a task's results that are no metric.
_NOT_METRICS = frozenset({"sample_len", "sample_count", "alias", "name"})
# The keys of lm-eval's results that describe tasks (merged across the runs of one model).
_RESULT_KEYS = ("results", "versions", "n-shot", "higher_is_better", "n-samples", "configs", "group_subtasks",
                "samples")

Progress = Callable[[str], None]


class HarnessError(Exception):
    """lm-eval cannot run as asked (not installed, an unknown task, weights not found)."""


@dataclass(frozen=True)
class EdgeTarget:
    """Where lm-eval's API models send their requests, and what they need to know about the model."""

    base_url: str  # the edge's root, e.g. http://127.0.0.1:8000
    model: str  # the served model's name
    tokenizer: str  # a folder with the model's HF tokenizer: local-completions counts the context's tokens with it
    api_key: str | None = None
    max_length: int = 2048  # prompt + answer, in tokens (the model's context at the edge)
    concurrency: int = 1  # requests in flight at once
    timeout_s: float = 300.0


@dataclass(frozen=True)
class HfWeights:
    """The weights lm-eval's ``hf`` model loads: a model folder."""

    pretrained: str
    dtype: str = "float32"
    device: str = "cpu"
    batch_size: int = 8


@dataclass(frozen=True)
class MetricRow:
    task: str
    metric: str  # lm-eval's "metric,filter" key
    ours: float
    ours_stderr: float | None
    hf: float | None = None
    hf_stderr: float | None = None

    @property
    def tolerance(self) -> float:
        return max(s for s in (self.ours_stderr, self.hf_stderr, 0.0) if s is not None and not math.isnan(s))

    @property
    def agrees(self) -> bool | None:
        """Whether the two scores differ by at most the larger stderr; None without an hf score."""
        if self.hf is None:
            return None
        return abs(self.ours - self.hf) <= self.tolerance + 1e-12


@dataclass
class HarnessReport:
    edge: dict[str, Any]  # lm-eval's results of the edge's run (all tasks)
    hf: dict[str, Any] | None = None
    rows: list[MetricRow] = field(default_factory=list)
    items: dict[str, str] = field(default_factory=dict)  # task -> how close the runs are item by item

    @property
    def agrees(self) -> bool:
        return all(row.agrees is not False for row in self.rows)


def edge_url(settings: Any) -> str:
    """The configured edge's root URL (a wildcard host is reached on the loopback)."""
    host = settings.edge.host
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return f"http://{host}:{settings.edge.port}"


def api_key(given: str | None, settings: Any, environ: Mapping[str, str]) -> str | None:
    """The key to send: given, else $SPECSTREAM_API_KEY, else $OPENAI_API_KEY, else the local key of
    `specstream up` (when auth is on and it exists)."""
    key = given or environ.get("SPECSTREAM_API_KEY") or environ.get("OPENAI_API_KEY")
    if key or not settings.edge.auth.enabled:
        return key or None
    from streams.edge.keys import keys_file_path, local_key_path

    local = local_key_path(keys_file_path(settings.edge.auth.keys_file))
    try:
        return local.read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def model_files(model: str, progress: Progress = lambda _: None) -> tuple[str, HfWeights]:
    """(the folder of the model's HF tokenizer, the weights for lm-eval's hf model) of a served model's name or
    path. A GGUF's folder is its conversion (made once, as the worker makes it): transformers read from
    ``gguf_file`` would give the same tensors after parsing the file's metadata again, four times."""
    from engine.model_ref import check_model_ref, gguf_for

    gguf = gguf_for(model)
    if gguf is None:
        try:
            check_model_ref(model)
        except FileNotFoundError as error:
            raise HarnessError(str(error)) from None
        folder = str(Path(model).expanduser().resolve())
        return folder, HfWeights(folder)
    from engine.loader import convert_gguf

    folder = str(convert_gguf(*gguf, progress=progress))
    return folder, HfWeights(folder)


def model_context(settings: Any, model: str) -> int:
    """The longest prompt + answer the edge accepts for the model, as the edge computes it."""
    if settings.engine.max_model_len:
        return int(settings.engine.max_model_len)
    from engine.model_text import model_context as context
    from streams.edge.tokenizers import ENGINE_DEFAULT_MAX_MODEL_LEN

    return min(context(model), ENGINE_DEFAULT_MAX_MODEL_LEN)


def require_lm_eval() -> None:
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        raise HarnessError("lm-evaluation-harness is not installed: pip install 'specstream[eval]' "
                           "(./dev test installs it)") from None


def bundled_task_config(name: str) -> dict[str, Any]:
    """A bundled task's config, its data_files pointed at the JSONL beside it (absolute: any working folder)."""
    config = yaml.safe_load((TASKS_DIR / f"{name}.yaml").read_text(encoding="utf-8"))
    files = config["dataset_kwargs"]["data_files"]
    config["dataset_kwargs"]["data_files"] = {split: str(TASKS_DIR / path) for split, path in files.items()}
    return config


def load_tasks(names: Sequence[str]) -> dict[str, Any]:
    """Task name -> lm-eval Task, for bundled names and lm-eval's own (a group stands for its tasks); only names
    that are not bundled make lm-eval index its own task folders."""
    require_lm_eval()
    from lm_eval.tasks import TaskManager

    specs: list[str | dict[str, Any]] = [bundled_task_config(n) if n in BUNDLED_TASKS else n for n in names]
    manager = TaskManager(include_defaults=any(isinstance(s, str) for s in specs))
    try:
        return dict(manager.load(specs)["tasks"])
    except (KeyError, ValueError) as error:
        raise HarnessError(f"unknown lm-eval task in {', '.join(names)}: {error}") from None


def scored_by_logprobs(task: Any) -> bool:
    return task.OUTPUT_TYPE in _SCORED_TYPES


def split_tasks(tasks: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    """(log-likelihood tasks: local-completions, generation tasks: local-chat-completions)."""
    scored = [t for t in tasks.values() if scored_by_logprobs(t)]
    generated = [t for t in tasks.values() if not scored_by_logprobs(t)]
    return scored, generated


def completions_model(target: EdgeTarget) -> Any:
    """lm-eval's local-completions model on the edge's /v1/completions: prompts go as token ids (its default)."""
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    return LocalCompletionsAPI(
        base_url=f"{target.base_url.rstrip('/')}/v1/completions", model=target.model, tokenizer=target.tokenizer,
        tokenizer_backend="huggingface", max_length=target.max_length, num_concurrent=target.concurrency,
        timeout=int(target.timeout_s), header=_header(target),
    )


def chat_model(target: EdgeTarget) -> Any:
    """lm-eval's local-chat-completions model on the edge's /v1/chat/completions (the edge applies the template)."""
    from lm_eval.models.openai_completions import LocalChatCompletion

    return LocalChatCompletion(
        base_url=f"{target.base_url.rstrip('/')}/v1/chat/completions", model=target.model,
        num_concurrent=target.concurrency, timeout=int(target.timeout_s), header=_header(target),
    )


def _header(target: EdgeTarget) -> dict[str, str]:
    # Given to the model object, not in model_args: lm-eval logs and records model_args.
    return {"Authorization": f"Bearer {target.api_key or ''}"}


def hf_model(weights: HfWeights) -> Any:
    """lm-eval's ``hf`` model (HFLM) on the given weights."""
    from lm_eval.models.huggingface import HFLM

    return HFLM(pretrained=weights.pretrained, dtype=weights.dtype, device=weights.device,
                batch_size=weights.batch_size)


def evaluate(lm_for: Callable[[bool], Any], scored: list[Any], generated: list[Any], *,
             limit: int | None = None) -> dict[str, Any]:
    """lm-eval's results for both groups of tasks, merged; ``lm_for(chat)`` gives the model for each group
    (generation tasks run as chats: lm-eval's apply_chat_template)."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    # The tasks are loaded already: left to itself, each run would index lm-eval's thousands of task files again
    # (~10 s each on 2 cores).
    manager = TaskManager(include_defaults=False)
    merged: dict[str, Any] = {}
    for tasks, chat in ((scored, False), (generated, True)):
        if not tasks:
            continue
        # Each run gets Task objects of its own: lm-eval fills a task's instances as it builds requests.
        out = simple_evaluate(model=lm_for(chat), tasks=[copy.deepcopy(t) for t in tasks], limit=limit,
                              apply_chat_template=chat, log_samples=True, bootstrap_iters=1000,
                              task_manager=manager)
        if out is None:
            raise HarnessError("lm-eval returned no results")
        for key in _RESULT_KEYS:
            merged.setdefault(key, {}).update(out.get(key) or {})
    return merged


def metric_rows(edge: dict[str, Any], hf: dict[str, Any] | None = None) -> list[MetricRow]:
    """One row per task and metric of the edge's results, with hf's score of the same beside it."""
    rows = []
    for task, values in edge["results"].items():
        theirs = (hf or {}).get("results", {}).get(task, {})
        for key, value in sorted(values.items()):
            metric, _, filt = key.partition(",")
            if metric.endswith("_stderr") or metric in _NOT_METRICS or _number(value) is None:
                continue
            stderr_key = f"{metric}_stderr,{filt}"
            rows.append(MetricRow(task, key, float(value), _number(values.get(stderr_key)),
                                  _number(theirs.get(key)), _number(theirs.get(stderr_key))))
    return rows


def sample_agreement(edge: dict[str, Any], hf: dict[str, Any]) -> dict[str, str]:
    """Per task, how close the two runs are item by item: the largest difference of a log-likelihood (scored
    tasks), or how many generated answers are the same text (generation tasks)."""
    out = {}
    for task, samples in edge.get("samples", {}).items():
        theirs = {s["doc_id"]: s for s in hf.get("samples", {}).get(task, [])}
        pairs = [(s, theirs[s["doc_id"]]) for s in samples if s["doc_id"] in theirs]
        if not pairs:
            continue
        lls = [(_loglikelihood(a), _loglikelihood(b)) for x, y in pairs for a, b in zip(x["resps"], y["resps"])]
        if all(a is not None and b is not None for a, b in lls):
            worst = max(abs(a - b) for a, b in lls)  # type: ignore[operator]
            out[task] = f"{len(lls)} log-likelihoods, largest |edge - hf| {worst:.2e}"
        else:
            same = sum(x["resps"] == y["resps"] for x, y in pairs)
            out[task] = f"{same} of {len(pairs)} generated answers the same text"
    return out


def _loglikelihood(resp: Any) -> float | None:
    """A loglikelihood request's answer as lm-eval logs it: [[logprob, is_greedy]]."""
    while isinstance(resp, (list, tuple)) and resp and isinstance(resp[0], (list, tuple)):
        resp = resp[0]
    if isinstance(resp, (list, tuple)) and len(resp) == 2 and isinstance(resp[1], bool):
        return _number(resp[0])
    return None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def results_table(results: dict[str, Any]) -> str:
    """lm-eval's results as its own table (lm_eval.utils.make_table's columns; its table loses its header row with
    the pytablewriter our lock holds)."""
    lines = ["| Tasks | Version | Filter | n-shot | Metric | | Value | | Stderr |", "|---|--:|---|--:|---|---|--:|---|--:|"]
    arrows = {True: "↑", False: "↓"}
    for task, values in results["results"].items():
        higher = results.get("higher_is_better", {}).get(task, {})
        for key, value in sorted(values.items()):
            metric, _, filt = key.partition(",")
            if metric.endswith("_stderr") or metric in _NOT_METRICS or _number(value) is None:
                continue
            stderr = _number(values.get(f"{metric}_stderr,{filt}"))
            lines.append(f"| {values.get('alias', task)} | {results.get('versions', {}).get(task, 'N/A')} | {filt} | "
                         f"{results.get('n-shot', {}).get(task, ' ')} | {metric} | {arrows.get(higher.get(metric), '')} "
                         f"| {float(value):.4f} | ± | {_fmt(stderr)} |")
    return "\n".join(lines)


def table(rows: Sequence[MetricRow]) -> str:
    """The comparison as a Markdown table (the hf columns only when there is an hf score)."""
    with_hf = any(r.hf is not None for r in rows)
    head = ["task", "metric", "edge", "± stderr"] + (["hf", "± stderr", "|diff|", "agrees"] if with_hf else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.task, r.metric, f"{r.ours:.4f}", _fmt(r.ours_stderr)]
        if with_hf:
            diff = "—" if r.hf is None else f"{abs(r.ours - r.hf):.4f}"
            cells += [_fmt(r.hf), _fmt(r.hf_stderr), diff, {True: "yes", False: "NO", None: "—"}[r.agrees]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _fmt(value: float | None) -> str:
    return "—" if value is None or math.isnan(value) else f"{value:.4f}"


def run_harness(tasks: dict[str, Any], target: EdgeTarget, *, hf: HfWeights | None = None, limit: int | None = None,
                progress: Progress = lambda _: None) -> HarnessReport:
    """The tasks (:func:`load_tasks`) through the edge (and, with ``hf``, through lm-eval's hf model), compared
    metric by metric."""
    scored, generated = split_tasks(tasks)
    progress(f"{len(scored)} log-likelihood task(s) via local-completions, {len(generated)} generation task(s) via "
             f"local-chat-completions, against {target.base_url} ({target.model})")
    models: dict[bool, Any] = {}

    def edge_lm(chat: bool) -> Any:
        if chat not in models:
            models[chat] = chat_model(target) if chat else completions_model(target)
        return models[chat]

    edge = evaluate(edge_lm, scored, generated, limit=limit)
    report = HarnessReport(edge=edge)
    if hf is not None:
        progress(f"lm-eval's hf model on {hf.pretrained} ({hf.dtype}, {hf.device})")
        model = hf_model(hf)
        report.hf = evaluate(lambda _chat: model, scored, generated, limit=limit)
    report.rows = metric_rows(edge, report.hf)
    report.items = sample_agreement(edge, report.hf) if report.hf is not None else {}
    return report
