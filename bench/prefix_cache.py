"""Prefix caching (issue 37): what a hit saves, and that nothing else gets slower or different.

    .venv/bin/python -m bench.prefix_cache copy --weights fp32       # the design choice: copying a cached prefix
                                                                     # into a region against prefilling it
    .venv/bin/python -m bench.prefix_cache chat --weights int4       # 6 turns through the stack (edge, Kafka,
                                                                     # worker), history to ~1,500 tokens: TTFT per
                                                                     # turn, cache on and off (a broker must run)
    .venv/bin/python -m bench.prefix_cache tools --weights int4      # 3 tool rounds: prompt tokens computed
                                                                     # against the tokens each round adds
    .venv/bin/python -m bench.prefix_cache pressure --weights fp32   # 16 long requests in a quarter of their KV,
                                                                     # the urgent half arriving while the rest hold
                                                                     # it: all complete, outputs as alone,
                                                                     # preemptions counted
    .venv/bin/python -m bench.prefix_cache shared-dataset --out /tmp/shared-600.jsonl
        # a specstream bench dataset: 64 chats sharing a 600-token system prompt; then, on a stack started with
        # SPECSTREAM_ENGINE__PREFIX_CACHING=true and again =false:
        #   specstream bench --dataset /tmp/shared-600.jsonl --no-shuffle --concurrency 16 --num-requests 64

Each part but shared-dataset prints one JSON line of figures and writes it to
bench/results/<date>-prefix-cache-<part>-<weights>.json (`--result PATH` elsewhere). `--quick` shrinks every part
to a smoke run (a few tokens, fewer turns and requests): write those to /tmp. The batch-1 and 16-concurrent rows of
`bench.engine_bench` take `--prefix-caching on|off` for the no-slowdown check. Run them on a quiet machine.
"""
from __future__ import annotations

import argparse
import json
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from bench.result_files import default_out

WORDS = ["kafka", "partition", "offset", "consumer", "group", "broker", "replica", "leader", "follower", "producer",
         "batch", "linger", "acks", "retention", "compaction", "segment", "index", "rebalance", "heartbeat", "session",
         "assignor", "coordinator", "transaction", "idempotent", "sequence", "epoch", "fetch"]


def filler(n_words: int, seed: int) -> str:
    """Deterministic prose-like text of about n_words words (about as many tokens)."""
    return " ".join(WORDS[(seed * 7 + i * (seed + 3)) % len(WORDS)] for i in range(n_words))


def _engine(weights: str, prefix_caching: bool, kv_bytes: int | None = None, **kw: Any) -> Any:
    from engine.config import EngineConfig, SpeculationConfig
    from engine.llm_engine import LLMEngine

    cfg = EngineConfig(weights=weights, prefix_caching=prefix_caching, kv_cache_bytes=kv_bytes or 256 << 20,
                       speculation=SpeculationConfig(enabled=True, method="ngram"), **kw)
    return LLMEngine.from_config(cfg)


def _prompt(engine: Any, messages: list[dict[str, Any]]) -> list[int]:
    text = engine.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(engine.tokenizer(text, add_special_tokens=False)["input_ids"])


class PrefillTally:
    """Prompt tokens computed per request (a step observer)."""

    def __init__(self, engine: Any) -> None:
        self.tokens: dict[str, int] = {}
        engine.add_step_observer(self)

    def __call__(self, record: Any) -> None:
        for s in record.batch.scheduled:
            if s.is_prefill:
                self.tokens[s.seq.request_id] = self.tokens.get(s.seq.request_id, 0) + s.num_new_tokens


# ------------------------------------------------------------------------------------------------------------ copy

def bench_copy(args: argparse.Namespace) -> dict[str, Any]:
    """Copy N tokens of KV between regions against prefilling N tokens, on the real model."""
    import torch

    from engine.request import EngineRequest, SamplingOptions

    engine = _engine(args.weights, prefix_caching=False)
    engine.generate([EngineRequest("warm-up", list(range(100, 164)), SamplingOptions(max_tokens=2))])  # first call
    cache, out = engine.kv_cache, {}
    for n in ([256] if args.quick else [256, 1024, 1536]):
        src, dst = cache.allocate(n + 8), cache.allocate(n + 8)
        reps = 3 if args.quick else 20
        t0 = time.perf_counter()
        for _ in range(reps):
            cache.copy(src.region.start, dst.region.start, n)
        copy_ms = 1000 * (time.perf_counter() - t0) / reps
        cache.free(src)
        cache.free(dst)
        ids = torch.randint(100, 20000, (n,), generator=torch.Generator().manual_seed(n)).tolist()
        t0 = time.perf_counter()
        engine.generate([EngineRequest(f"p{n}", ids, SamplingOptions(max_tokens=1))])
        out[n] = {"copy_ms": round(copy_ms, 2), "prefill_ms": round(1000 * (time.perf_counter() - t0), 1)}
    return {"part": "copy", "weights": args.weights, "kv_dtype": str(cache.dtype), "tokens": out}


# ------------------------------------------------------------------------------------------------------------ chat

def _stack(args: argparse.Namespace, prefix_caching: bool) -> AbstractContextManager[Any]:
    from streams.testing.stack import running_stack

    env = {"SPECSTREAM_ENGINE__WEIGHTS": args.weights, "SPECSTREAM_ENGINE__PREFIX_CACHING": str(prefix_caching).lower(),
           "SPECSTREAM_ENGINE__KV_CACHE_BYTES": "256MiB"}
    return running_stack(args.bootstrap_servers, env=env)


def _chat_turn(client: Any, stack: Any, messages: list[dict[str, Any]], max_tokens: int, key: str) -> dict[str, Any]:
    body = {"model": stack.model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "prompt_cache_key": key}
    start, first, text, usage = time.perf_counter(), None, [], {}
    with client.stream("POST", stack.base_url + "/v1/chat/completions", json=body, headers=stack.headers) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices", []):
                if choice["delta"].get("content"):
                    first = first or time.perf_counter()
                    text.append(choice["delta"]["content"])
    return {"ttft_s": (first or time.perf_counter()) - start, "text": "".join(text), "usage": usage}


def bench_chat(args: argparse.Namespace) -> dict[str, Any]:
    """A 6-turn chat through the stack; each user message is long enough that the history nears 1,500 tokens."""
    import httpx

    turns, words, max_tokens = (3, 40, 8) if args.quick else (6, 190, 48)
    result: dict[str, Any] = {"part": "chat", "weights": args.weights}
    for caching in (True, False):
        with _stack(args, caching) as stack, httpx.Client(timeout=300) as client:
            _chat_turn(client, stack, [{"role": "user", "content": "warm up"}], 4, "warm-up")
            messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a concise Kafka expert."}]
            rows = []
            for turn in range(turns):
                messages.append({"role": "user", "content": f"Question {turn + 1}: " + filler(words, turn)})
                got = _chat_turn(client, stack, messages, max_tokens, f"bench-chat-{caching}")
                messages.append({"role": "assistant", "content": got["text"]})
                details = got["usage"].get("prompt_tokens_details") or {}
                rows.append({"turn": turn + 1, "ttft_ms": round(1000 * got["ttft_s"]), "text": got["text"],
                             "prompt_tokens": got["usage"].get("prompt_tokens"),
                             "cached_tokens": details.get("cached_tokens")})
        name = "on" if caching else "off"
        result[name] = [{k: v for k, v in r.items() if k != "text"} for r in rows]
        result[f"{name}_last_over_first"] = round(rows[-1]["ttft_ms"] / max(1, rows[0]["ttft_ms"]), 2)
        result[f"{name}_texts"] = [r["text"] for r in rows]
    result["same_text"] = result.pop("on_texts") == result.pop("off_texts")
    return result


# ----------------------------------------------------------------------------------------------------------- tools

def bench_tools(args: argparse.Namespace) -> dict[str, Any]:
    """Three server-side tool rounds as the worker builds them (the conversation plus the assistant's call and the
    tool's result each round): prompt tokens computed against the tokens each round's prompt adds."""
    from engine.request import EngineRequest, SamplingOptions

    engine = _engine(args.weights, prefix_caching=True)
    tally = PrefillTally(engine)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You can call the python tool. " + filler(60, 1)},
        {"role": "user", "content": "Compute the partition sizes. " + filler(40, 2)},
    ]
    rounds, previous, added = (2 if args.quick else 3), 0, []
    for r in range(rounds + 1):
        prompt = _prompt(engine, messages)
        added.append(len(prompt) - previous)
        previous = len(prompt)
        engine.generate([EngineRequest(f"round{r}", prompt, SamplingOptions(max_tokens=4 if args.quick else 32))])
        call = {"name": "python", "arguments": {"code": f"print(sum(range({r + 10})))"}}
        messages.append({"role": "assistant", "content": f"<tool_call>\n{json.dumps(call)}\n</tool_call>"})
        messages.append({"role": "tool", "content": json.dumps({"stdout": filler(30 if args.quick else 80, r)})})
    computed = [tally.tokens[f"round{r}"] for r in range(rounds + 1)]
    later = range(1, rounds + 1)  # the first prompt is new as a whole
    return {"part": "tools", "weights": args.weights, "computed": computed, "added": added,
            "computed_over_added": round(sum(computed[i] for i in later) / sum(added[i] for i in later), 3)}


# -------------------------------------------------------------------------------------------------------- pressure

def pressure_jobs(engine: Any, n: int, prompt_words: int, new_tokens: int) -> tuple[list[Any], list[Any]]:
    """n long chat requests, half greedy and half seeded: the first half at a low priority (2), the second half
    urgent (0), so that the urgent ones, arriving while the others hold the KV, preempt them."""
    from engine.request import EngineRequest, SamplingOptions

    jobs = []
    for i in range(n):
        ids = _prompt(engine, [{"role": "user", "content": f"Request {i}: " + filler(prompt_words + 7 * i, i)}])
        sampling = SamplingOptions(max_tokens=new_tokens, ignore_eos=True, temperature=0.8 if i % 2 else 0.0,
                                   top_p=0.95, seed=i)
        jobs.append(EngineRequest(f"r{i}", ids, sampling, priority=2 if i < n // 2 else 0))
    return jobs[: n // 2], jobs[n // 2 :]


def kv_budget_for(engine: Any, jobs: list[Any], fraction: float) -> int:
    """Bytes of KV for `fraction` of the slots all of `jobs` reserve at once (never below the largest one alone,
    which would be refused)."""
    from engine.kv_cache import region_size

    slots = [region_size(len(j.prompt_token_ids) + j.sampling.max_tokens, engine.max_draft_tokens) for j in jobs]
    return int(max(sum(slots) * fraction, max(slots))) * engine.kv_cache.bytes_per_token


def generate_staggered(engine: Any, first: list[Any], later: list[Any], steps_between: int) -> dict[str, Any]:
    """`first` added at once, `later` added after `steps_between` steps (while `first` holds the KV); every output
    merged per request, as LLMEngine.generate returns them."""
    from engine.outputs import RequestOutputAccum

    acc = {r.request_id: RequestOutputAccum(r.request_id) for r in [*first, *later]}
    for r in first:
        engine.add_request(r)
    steps = 0
    while engine.has_unfinished() or later:
        if steps == steps_between:
            for r in later:
                engine.add_request(r)
            later = []
        for out in engine.step():
            acc[out.request_id].add(out)
        steps += 1
    return acc


def _fresh(jobs: list[Any]) -> list[Any]:
    from engine.request import EngineRequest

    return [EngineRequest(j.request_id, j.prompt_token_ids, j.sampling, priority=j.priority) for j in jobs]


def bench_pressure(args: argparse.Namespace) -> dict[str, Any]:
    """16 long requests in a quarter of the KV they need at once, the urgent half arriving while the rest hold it:
    all complete, each output equal to the request run alone, preemptions counted."""
    n, prompt_words, new = (4, 60, 8) if args.quick else (16, 300, 64)
    alone_engine = _engine(args.weights, prefix_caching=False)
    first, later = pressure_jobs(alone_engine, n, prompt_words, new)
    alone = {j.request_id: alone_engine.generate([j])[j.request_id].token_ids for j in _fresh([*first, *later])}
    engine = _engine(args.weights, prefix_caching=True, kv_bytes=kv_budget_for(alone_engine, [*first, *later], 0.25))
    t0 = time.perf_counter()
    got = generate_staggered(engine, _fresh(first), _fresh(later), steps_between=4)
    wall = time.perf_counter() - t0
    counters = engine.prefix_cache_counters()
    return {"part": "pressure", "weights": args.weights, "requests": n, "kv_tokens": engine.kv_cache.num_tokens,
            "completed": sum(r.finished for r in got.values()),
            "same_as_alone": all(got[k].token_ids == v for k, v in alone.items()),
            "preemptions": counters.preemptions, "wall_s": round(wall, 1)}


# -------------------------------------------------------------------------------------------------- shared dataset

def shared_dataset(args: argparse.Namespace) -> dict[str, Any]:
    """A specstream bench dataset: chats that share one ~600-token system prompt, each with its own question."""
    system = "You answer questions about this deployment. Context: " + filler(args.system_words, 0)
    with open(args.out, "w") as f:
        for i in range(args.requests):
            messages = [{"role": "system", "content": system},
                        {"role": "user", "content": f"Question {i}: " + filler(12, i + 1)}]
            f.write(json.dumps({"messages": messages}) + "\n")
    return {"part": "shared-dataset", "out": args.out, "requests": args.requests}


PARTS = {"copy": bench_copy, "chat": bench_chat, "tools": bench_tools, "pressure": bench_pressure,
         "shared-dataset": shared_dataset}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("part", choices=sorted(PARTS))
    ap.add_argument("--weights", default="fp32", choices=("fp32", "bf16", "int8", "int4"))
    ap.add_argument("--quick", action="store_true", help="a smoke run: a few tokens, fewer turns and requests")
    ap.add_argument("--bootstrap-servers", default="127.0.0.1:9092", help="chat: the Kafka broker the stack uses")
    ap.add_argument("--out", default="/tmp/specstream-shared-600.jsonl", help="shared-dataset: where to write it")
    ap.add_argument("--requests", type=int, default=64, help="shared-dataset: chats in the file")
    ap.add_argument("--system-words", type=int, default=560, help="shared-dataset: ~600 tokens with the template")
    ap.add_argument("--result", help="where to write the JSON figures (default bench/results/<date>-prefix-cache-"
                    "<part>-<weights>.json; a smoke run or a busy machine's: --result /tmp/...)")
    args = ap.parse_args(argv)
    result = PARTS[args.part](args)
    print(json.dumps(result), flush=True)
    if args.part != "shared-dataset":
        path = Path(args.result or default_out(f"prefix-cache-{args.part}-{args.weights}"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
