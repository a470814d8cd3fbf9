"""What the benchmark asks: built-in synthetic request sets and JSONL datasets.

Built-in sets start from the prompts of ``bench/workloads.py`` and add seeded
variations of them:

* ``chat``: open questions (no answer in the prompt: speculation by prompt
  lookup has nothing to copy), optionally after earlier conversation turns;
* ``code``: "rename a variable and print the whole code" edits (most of the
  answer is in the prompt);
* ``rag``: questions about a quoted context, answered by quoting it;
* ``mixed``: the three in turn.

Prompt length is steered in *approximate* tokens (4 characters a token; the
client need not have the tokenizer): ``--input-len`` adds conversation turns,
functions or context paragraphs until the prompt reaches it. The real prompt
token counts come back in each completion's usage and are what the report uses.

Output length: ``max_tokens`` is ``--output-len`` times a uniform factor in
``1 ± --output-len-jitter``; the model may stop earlier at its end-of-text.

One seed fixes everything drawn at random here: which prompts, their order,
their lengths and each request's sampling seed.
"""
from __future__ import annotations

import json
import random
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def _base_workloads() -> Any:
    """bench/workloads.py: importable from the repository root; found next to this package otherwise (editable installs)."""
    try:
        from bench import workloads

        return workloads
    except ImportError:
        import importlib.util

        path = Path(__file__).resolve().parents[2] / "bench" / "workloads.py"
        spec = importlib.util.spec_from_file_location("specstream_bench_workloads", path)
        if spec is None or spec.loader is None or not path.is_file():
            raise ImportError(f"bench/workloads.py not found (looked in {path}); run from the repository") from None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
        spec.loader.exec_module(module)
        return module


base = _base_workloads()

SETS = ("chat", "code", "rag", "mixed")
CHARS_PER_TOKEN = 4


@dataclass(frozen=True)
class BenchSampling:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    speculation: bool | None = None


@dataclass(frozen=True)
class BenchRequest:
    """One request of a run, identical whichever backend sends it."""

    index: int  # position in the run's sequence (warmup requests come first)
    workload: str
    max_tokens: int
    seed: int  # sampling seed of this request
    messages: tuple[dict[str, str], ...] | None = None
    prompt: str | None = None
    sampling: BenchSampling = field(default_factory=BenchSampling)

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("a bench request has exactly one of messages and prompt")

    @property
    def approx_prompt_tokens(self) -> int:
        text = self.prompt if self.prompt is not None else "".join(m["content"] for m in self.messages or ())
        return max(1, len(text) // CHARS_PER_TOKEN)

    def messages_list(self) -> list[dict[str, str]] | None:
        return [dict(m) for m in self.messages] if self.messages is not None else None


@dataclass(frozen=True)
class LengthSpec:
    output_len: int = 64
    output_len_jitter: float = 0.0
    input_len: int | None = None  # approximate prompt tokens; None: the prompt's natural length
    input_len_jitter: float = 0.0

    def __post_init__(self) -> None:
        if self.output_len < 1:
            raise ValueError("--output-len must be at least 1")
        for name in ("output_len_jitter", "input_len_jitter"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be within [0, 1)")
        if self.input_len is not None and self.input_len < 1:
            raise ValueError("--input-len must be at least 1")

    def draw_output(self, rng: random.Random) -> int:
        return _jitter(rng, self.output_len, self.output_len_jitter)

    def draw_input(self, rng: random.Random) -> int | None:
        return None if self.input_len is None else _jitter(rng, self.input_len, self.input_len_jitter)


def _jitter(rng: random.Random, value: int, jitter: float) -> int:
    if not jitter:
        return value
    return max(1, round(value * rng.uniform(1 - jitter, 1 + jitter)))


# --- built-in sets -----------------------------------------------------------------------------------------------

_CHAT_TEMPLATES = (
    "Why do people enjoy {}? Give a few reasons.",
    "What are the main advantages and drawbacks of {}?",
    "Explain {} to a curious teenager in a few sentences.",
    "Give me three practical tips about {}.",
    "Write a short paragraph describing {} to someone who has never heard of it.",
)
_CHAT_TOPICS = (
    "long walks in the countryside", "baking bread at home", "learning a second language", "cycling to work",
    "keeping a garden", "reading old novels", "camping by a lake", "playing chess", "watching the stars",
    "cooking for friends", "swimming in the sea", "visiting museums", "writing letters by hand",
    "growing tomatoes", "repairing an old bicycle", "hiking in the mountains",
)
_CHAT_HISTORY = (
    ("What is a good name for a grey cat?", "Some good names for a grey cat are Smokey, Ash, Pebble and Misty."),
    ("How long should I boil an egg?", "For a soft yolk boil it six minutes; for a firm yolk about ten minutes."),
    ("Which is bigger, a lake or a pond?", "A lake is usually bigger and deeper than a pond, though there is no strict rule."),
    ("Can you suggest a weekend activity?", "You could visit a local market, go for a bike ride, or try a new recipe."),
    ("What colour do you get from mixing blue and yellow?", "Mixing blue and yellow paint gives green."),
    ("Is it better to study in the morning or evening?", "It depends on the person; many people focus best in the morning."),
)
_RENAMES = (
    ("totals", "spent"), ("counts", "tally"), ("largest", "biggest"), ("report", "rows"),
    ("average", "mean"), ("customer", "client"), ("rates", "factors"), ("amount", "value"),
)
_RAG_QUESTIONS = (
    "What happened when the railway reached Lindvik, and what did the town council decide after 1688?",
    "Why did fishermen first begin to winter in the inlet of Lindvik?",
    "What is the oldest surviving structure in Lindvik, and who paid for it?",
    "How did the population of Lindvik change between 1870 and 1900, and why?",
    "What happened to the canneries of Lindvik in the twentieth century?",
    "What is Lindvik known for today?",
)


def _function_code() -> str:
    return base.CODE_FUNCTION


def _context_paragraphs() -> list[str]:
    return [p for p in base.RAG_CONTEXT.split("\n\n") if p.strip()]


def _chat(rng: random.Random, variant: int, input_len: int | None) -> tuple[dict[str, str], ...]:
    if variant == 0:
        question = base.OPEN_QUESTION.messages[0]["content"]
    else:
        question = rng.choice(_CHAT_TEMPLATES).format(rng.choice(_CHAT_TOPICS))
    messages: list[dict[str, str]] = []
    if input_len is not None:
        budget = input_len * CHARS_PER_TOKEN - len(question)
        pool = list(_CHAT_HISTORY)
        rng.shuffle(pool)
        i = 0
        while budget > 0:
            q, a = pool[i % len(pool)]
            messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
            budget -= len(q) + len(a)
            i += 1
    messages.append({"role": "user", "content": question})
    return tuple(messages)


def _code(rng: random.Random, variant: int, input_len: int | None) -> tuple[dict[str, str], ...]:
    old, new = _RENAMES[0] if variant == 0 else rng.choice(_RENAMES)
    code = _function_code()
    if input_len is not None:
        copies = [code]
        n = 2
        while sum(map(len, copies)) < input_len * CHARS_PER_TOKEN:
            copies.append(re.sub(r"\bdef (\w+)", rf"def \1_v{n}", code).replace("convert(", f"convert_v{n}("))
            n += 1
        code = "\n\n".join(copies)
    content = (
        f"Rename the variable `{old}` to `{new}` in this Python code and print the whole updated code, "
        f"nothing else.\n\n```python\n{code}```"
    )
    return ({"role": "user", "content": content},)


def _rag(rng: random.Random, variant: int, input_len: int | None) -> tuple[dict[str, str], ...]:
    if variant == 0 and input_len is None:
        return tuple(base.RAG_ANSWER.messages)  # the engine benchmark's own RAG prompt
    paragraphs = _context_paragraphs()
    question = _RAG_QUESTIONS[0] if variant == 0 else rng.choice(_RAG_QUESTIONS)
    if variant != 0:
        rng.shuffle(paragraphs)
    if input_len is not None:
        kept: list[str] = []
        budget = input_len * CHARS_PER_TOKEN - len(question)
        for p in paragraphs:
            if kept and budget <= 0:
                break
            kept.append(p)
            budget -= len(p)
        paragraphs = kept
    content = (
        "Answer using only the context below, quoting the sentences you rely on word for word.\n\n"
        "Context:\n" + "\n\n".join(paragraphs) + f"\n\nQuestion: {question}"
    )
    return ({"role": "user", "content": content},)


_BUILDERS = {"chat": _chat, "code": _code, "rag": _rag}


def synthetic(
    name: str, lengths: LengthSpec, seed: int, sampling: BenchSampling = BenchSampling()
) -> Iterator[BenchRequest]:
    """Endless requests of a built-in set; the first of each kind is the prompt of bench/workloads.py verbatim."""
    if name not in SETS:
        raise ValueError(f"unknown workload {name!r}; choose one of {', '.join(SETS)} or give --dataset")
    rng = random.Random(f"workload:{name}:{seed}")
    seeds = random.Random(f"sampling:{seed}")
    kinds = ("chat", "code", "rag") if name == "mixed" else (name,)
    i = 0
    while True:
        kind = kinds[i % len(kinds)]
        variant = i // len(kinds)
        input_len = lengths.draw_input(rng)
        messages = _BUILDERS[kind](rng, variant, input_len)
        yield BenchRequest(
            index=i, workload=kind, messages=messages, max_tokens=lengths.draw_output(rng),
            seed=seeds.randrange(2**31), sampling=sampling,
        )
        i += 1


# --- datasets ----------------------------------------------------------------------------------------------------


def load_dataset(path: str | Path) -> list[dict[str, Any]]:
    """Read a JSONL file of prompts.

    Each line is an object with one of ``prompt`` (text, sent to /v1/completions),
    ``messages`` (a chat, sent to /v1/chat/completions) or ``conversations``
    (ShareGPT: its first human turn becomes the one user message); optional
    ``max_tokens`` (or ``output_len``) overrides the drawn output length.
    Blank lines and lines starting with ``#`` are skipped.
    """
    rows: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not JSON: {error.msg}") from error
            if isinstance(item, str):
                item = {"prompt": item}
            if not isinstance(item, dict):
                raise ValueError(f"{path}:{number}: expected an object with 'prompt' or 'messages'")
            rows.append(_dataset_row(item, f"{path}:{number}"))
    if not rows:
        raise ValueError(f"{path}: no prompts")
    return rows


def _dataset_row(item: dict[str, Any], where: str) -> dict[str, Any]:
    row: dict[str, Any] = {}
    if isinstance(item.get("prompt"), str):
        row["prompt"] = item["prompt"]
    elif isinstance(item.get("messages"), list):
        messages = []
        for m in item["messages"]:
            if not (isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role") in ("system", "user", "assistant", "tool")):
                raise ValueError(f"{where}: each message needs a role (system/user/assistant/tool) and a text content")
            messages.append({"role": m["role"], "content": m["content"]})
        if not messages:
            raise ValueError(f"{where}: empty messages")
        row["messages"] = tuple(messages)
    elif isinstance(item.get("conversations"), list):
        first = next((t for t in item["conversations"] if isinstance(t, dict) and t.get("from") in ("human", "user")), None)
        if first is None or not isinstance(first.get("value"), str):
            raise ValueError(f"{where}: no human turn in conversations")
        row["messages"] = ({"role": "user", "content": first["value"]},)
    else:
        raise ValueError(f"{where}: needs 'prompt' (string), 'messages' (list) or 'conversations' (ShareGPT)")
    out = item.get("max_tokens", item.get("output_len"))
    if out is not None:
        if not isinstance(out, int) or out < 1:
            raise ValueError(f"{where}: max_tokens must be a positive integer")
        row["max_tokens"] = out
    return row


def from_dataset(
    rows: list[dict[str, Any]], lengths: LengthSpec, seed: int, sampling: BenchSampling = BenchSampling(),
    shuffle: bool = True, name: str = "dataset",
) -> Iterator[BenchRequest]:
    """Endless requests cycling through the dataset (in a seeded order unless ``shuffle`` is false)."""
    rng = random.Random(f"dataset:{seed}")
    seeds = random.Random(f"sampling:{seed}")
    order = list(range(len(rows)))
    i = 0
    while True:
        if i % len(rows) == 0 and shuffle:
            rng.shuffle(order)
        row = rows[order[i % len(rows)]]
        drawn = lengths.draw_output(rng)
        yield BenchRequest(
            index=i, workload=name, prompt=row.get("prompt"), messages=row.get("messages"),
            max_tokens=row.get("max_tokens", drawn), seed=seeds.randrange(2**31), sampling=sampling,
        )
        i += 1


def take(source: Iterator[BenchRequest], n: int) -> list[BenchRequest]:
    return [next(source) for _ in range(n)]
