"""Training sequences for a draft head: the completions log first, generation with the target for the rest.

A sequence is (prompt + completion token ids, number of prompt tokens). From the
log, the prompt is rendered exactly as the worker rendered it (chat template
included) and the completion text is tokenized after it; records without their
prompt (log_prompt false for the tenant), failed and interrupted requests, and
repeats of a request id are skipped (streams.eval.source.select_records).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from schemas.events import CompletionRecord
from streams.eval.source import read_topic, select_records
from streams.kafka.connection import Connectable

Sequence = tuple[list[int], int]  # (tokens, num_prompt_tokens)
Progress = Callable[[str], None]


@dataclass
class LogSamples:
    sequences: list[Sequence]
    counts: dict[str, int]  # select_records' counts: replayable, prompt_not_logged, ...


async def from_completions_log(
    kafka: Connectable, topic: str, tokenizer: Any, *, limit: int | None, max_len: int, timeout_s: float = 60.0
) -> LogSamples:
    """The topic from its beginning to its end now; at most `limit` usable records."""
    from streams.wire.chat_template import prompt_token_ids

    read = await read_topic(kafka, topic, CompletionRecord, timeout_s=timeout_s)
    selection = select_records(read, limit=limit)
    sequences: list[Sequence] = []
    for record in selection.records:
        if record.request is None or record.completion is None or not record.completion.text:
            continue
        prompt = prompt_token_ids(record.request, tokenizer)
        completion = list(tokenizer(record.completion.text, add_special_tokens=False)["input_ids"])
        tokens = (prompt + completion)[:max_len]
        if len(tokens) > len(prompt) + 1:
            sequences.append((tokens, len(prompt)))
    return LogSamples(sequences, selection.counts())


def chat_prompt_ids(tokenizer: Any, message: str) -> list[int]:
    """One user message through the chat template, as the worker renders chat requests."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": message}], tokenize=False,
                                         add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def generate(engine: Any, prompts: list[list[int]], max_tokens: int, progress: Progress) -> list[Sequence]:
    """Greedy answers of the target (an LLMEngine without speculation) to every prompt, batched."""
    from engine.request import EngineRequest, SamplingOptions

    params = SamplingOptions(max_tokens=max_tokens, temperature=0.0)
    for i, prompt in enumerate(prompts):
        engine.add_request(EngineRequest(request_id=f"gen-{i}", prompt_token_ids=prompt, sampling=params))
    outputs: dict[str, list[int]] = {f"gen-{i}": [] for i in range(len(prompts))}
    done = steps = tokens = 0
    from engine.speculative.eagle_train import bar

    while engine.has_unfinished():
        steps += 1
        for out in engine.step():
            outputs[out.request_id].extend(out.token_ids)
            tokens += len(out.token_ids)
            done += out.finished
        if steps % 25 == 0 or not engine.has_unfinished():
            progress(f"generating {bar(done, len(prompts))} answers, {tokens} tokens")
    return [(prompt + outputs[f"gen-{i}"], len(prompt)) for i, prompt in enumerate(prompts) if outputs[f"gen-{i}"]]
