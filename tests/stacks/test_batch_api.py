"""Offline batch jobs (OpenAI's Batch API), checked with the official `openai` client against a real stack:
edge, engine worker and batch assembler as processes, the real model and Kafka.

A 40-line batch (chat and completions, seeded, greedy, two lines failing at run time) completes with one output
line per successful custom_id, equal to the same request sent interactively; tool-calling lines give whole calls
(a call cut off by max_tokens is content, finish_reason length); a worker and the assembler killed
(-9) mid-batch still answer every line once; a cancelled batch stops and keeps what finished; an upload with bad
lines is refused naming them; unknown ids are 404. Answers are a few tokens long.
"""
from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import OpenAI

from streams.batch.validation import dumps_line
from streams.testing.stack import DEFAULT_MODEL as MODEL
from streams.testing.stack import Process, Stack, running_stack, spawn_process
from streams.edge.keys import create_key
from tests.edge_support import MAX_MODEL_LEN, WORKER_ENV
from tests.kafka_fixtures import kafka_bootstrap, kafka_single  # noqa: F401  (pytest fixtures)

pytestmark = [pytest.mark.kafka, pytest.mark.model, pytest.mark.timeout(900)]
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


@pytest.fixture(scope="module")
def stack(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:  # noqa: F811
    logs = tmp_path_factory.mktemp("batch-stack")
    env = {**WORKER_ENV, "SPECSTREAM_FILES__DIR": str(logs / "files"), "SPECSTREAM_BATCH__ASSEMBLER__ID": "asm-1",
           "SPECSTREAM_BATCH__ASSEMBLER__PROGRESS_INTERVAL_S": "0.2"}
    with running_stack(kafka_bootstrap, env=env, log_dir=logs) as running:
        running.processes.append(spawn_process("assembler", ["batch", "assembler"], running.env, logs))
        yield running


@pytest.fixture(scope="module")
def client(stack: Stack) -> OpenAI:
    return OpenAI(base_url=stack.base_url + "/v1", api_key=stack.api_key, max_retries=0, timeout=120)


def chat(text: str, **sampling: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 4, **sampling}


def completion(text: str, **sampling: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": text, "max_tokens": 4, **sampling}


def forty_lines() -> list[tuple[str, str, dict[str, Any]]]:
    lines: list[tuple[str, str, dict[str, Any]]] = []
    for i in range(19):
        sampling = {"seed": 100 + i, "temperature": 0.8} if i % 2 else {}
        lines.append((f"chat-{i}", CHAT, chat(f"Name a color number {i}.", **sampling)))
        lines.append((f"text-{i}", COMPLETIONS, completion(f"Fact {i}: the sky is", **sampling)))
    lines.append(("unknown-model", CHAT, {**chat("hi"), "model": "gpt-9"}))
    lines.append(("too-long", COMPLETIONS, completion("hello", max_tokens=4000)))
    return lines


def submit(client: OpenAI, lines: list[tuple[str, str, dict[str, Any]]]) -> str:
    data = "\n".join(dumps_line(cid, url, body) for cid, url, body in lines).encode()
    uploaded = client.files.create(file=("batch.jsonl", data), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h",
                                  metadata={"test": "yes"})
    assert batch.status == "in_progress" and batch.request_counts.total == len(lines)
    return batch.id


def wait_for(client: OpenAI, batch_id: str, done: Any, stack: Stack, timeout_s: float = 600) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if done(batch):
            return batch
        stack.check_alive()
        time.sleep(0.5)
    raise AssertionError(f"batch {batch_id} not there after {timeout_s}s: {batch}\n{stack.logs()}")


def finished(batch: Any) -> bool:
    return batch.status in ("completed", "failed", "expired", "cancelled")


def file_lines(client: OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()] if file_id else []


def test_a_forty_line_batch_answers_each_line_once_like_interactive_requests(client: OpenAI, stack: Stack) -> None:
    lines = forty_lines()
    batch = wait_for(client, submit(client, lines), finished, stack)
    assert batch.status == "completed", batch
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (40, 38, 2)
    output, errors = file_lines(client, batch.output_file_id), file_lines(client, batch.error_file_id)
    assert sorted(o["custom_id"] for o in output) == sorted(cid for cid, *_ in lines[:38])
    assert {e["custom_id"]: e["response"]["status_code"] for e in errors} == {"unknown-model": 404, "too-long": 400}
    assert errors[0]["response"]["body"]["error"]["code"] in ("model_not_found", "context_length_exceeded")
    answers = {o["custom_id"]: o["response"]["body"] for o in output}
    for cid, url, body in lines[:8]:  # greedy and seeded, chat and completions: the same text interactively
        if url == CHAT:
            interactive = client.chat.completions.create(**body).choices[0].message.content
            assert answers[cid]["choices"][0]["message"]["content"] == interactive, cid
        else:
            interactive = client.completions.create(**body).choices[0].text
            assert answers[cid]["choices"][0]["text"] == interactive, cid
    assert batch.id in [b.id for b in client.batches.list(limit=100).data]


def test_cancel_mid_batch_stops_taking_lines_and_keeps_what_finished(client: OpenAI, stack: Stack) -> None:
    lines = [(f"c-{i}", CHAT, chat(f"Tell a story about {i}.", max_tokens=12)) for i in range(40)]
    batch_id = submit(client, lines)
    wait_for(client, batch_id, lambda b: b.request_counts.completed >= 2, stack)
    cancelling = client.batches.cancel(batch_id)
    assert cancelling.status in ("cancelling", "cancelled")
    asked = time.monotonic()
    batch = wait_for(client, batch_id, finished, stack, timeout_s=120)
    assert batch.status == "cancelled" and time.monotonic() - asked < 60
    output, errors = file_lines(client, batch.output_file_id), file_lines(client, batch.error_file_id)
    assert len(output) == batch.request_counts.completed >= 2
    assert batch.request_counts.completed < 40
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    assert sorted(o["custom_id"] for o in output + errors) == sorted(cid for cid, *_ in lines)


def test_cancel_aborts_the_lines_already_generating_within_seconds(client: OpenAI, stack: Stack) -> None:
    lines = [(f"long-{i}", COMPLETIONS, completion(f"Chapter {i}. It was a dark night and", max_tokens=400,
                                                     temperature=1.0, seed=i)) for i in range(16)]
    batch_id = submit(client, lines)
    time.sleep(4)  # the worker has taken its slots' worth of lines; 400 tokens each take far longer than this
    client.batches.cancel(batch_id)
    asked = time.monotonic()
    batch = wait_for(client, batch_id, finished, stack, timeout_s=60)
    assert batch.status == "cancelled" and time.monotonic() - asked < 10, batch
    errors = file_lines(client, batch.error_file_id)
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    assert any("while this line ran" in e["error"]["message"] for e in errors)  # aborted, not left to finish
    assert len(errors) + batch.request_counts.completed == 16


def test_upload_of_bad_lines_is_refused_naming_them(client: OpenAI) -> None:
    good = dumps_line("a", CHAT, chat("hi"))
    data = "\n".join([good, "{oops", dumps_line("a", CHAT, chat("hi")), dumps_line("b", "/v1/embeddings", {})])
    with pytest.raises(openai.BadRequestError) as caught:
        client.files.create(file=("bad.jsonl", data.encode()), purpose="batch")
    message = caught.value.message
    assert "line 2" in message and "line 3 (custom_id)" in message and "line 4 (url)" in message


def test_unknown_batch_and_file_ids_are_404_in_openai_shape(client: OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.batches.retrieve("batch_nope")
    assert caught.value.code == "batch_not_found"
    with pytest.raises(openai.NotFoundError):
        client.batches.cancel("batch_nope")
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id="file-nope", endpoint=CHAT, completion_window="24h")
    with pytest.raises(openai.BadRequestError) as bad:
        client.batches.create(input_file_id="file-x", endpoint=CHAT, completion_window="1h")  # type: ignore[arg-type]
    assert bad.value.param == "completion_window"


def test_a_tenants_batch_spends_its_batch_budget_not_its_interactive_limits(stack: Stack) -> None:
    assert stack.keys_file is not None
    key, _ = create_key(stack.keys_file, "batcher", rpm=0, tpm=300, concurrency=0, batch_tokens_per_day=2000,
                        batch_queued_lines=1000)
    limited = OpenAI(base_url=stack.base_url + "/v1", api_key=key, max_retries=0, timeout=120)
    time.sleep(1.5)  # the edge re-reads the keys file at most once a second
    lines = [(f"q-{i}", COMPLETIONS, completion(f"Count to {i}:", max_tokens=60)) for i in range(20)]  # > 1200 tokens
    batch_id = submit(limited, lines)
    try:
        # Right after a batch of four times its tpm, an interactive request is admitted: the batch spent none of it.
        assert limited.completions.create(**completion("Hello")).choices[0].text is not None
        with pytest.raises(openai.RateLimitError) as caught:  # the same batch again: past 2000 tokens a day
            submit(limited, lines)
        assert "batch_tokens_per_day" in caught.value.message
    finally:
        limited.batches.cancel(batch_id)


def test_a_line_without_max_tokens_gets_the_default_capped_to_the_context_left(client: OpenAI, stack: Stack) -> None:
    long_prompt = " ".join(["apple"] * (MAX_MODEL_LEN - 100))  # fits, but not with the default max_tokens
    lines = [("capped", COMPLETIONS, {"model": MODEL, "prompt": long_prompt, "temperature": 0}),
             ("given", COMPLETIONS, {"model": MODEL, "prompt": long_prompt, "max_tokens": 200})]
    batch = wait_for(client, submit(client, lines), finished, stack)
    output, errors = file_lines(client, batch.output_file_id), file_lines(client, batch.error_file_id)
    assert [o["custom_id"] for o in output] == ["capped"]  # like an interactive request without max_tokens
    usage = output[0]["response"]["body"]["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] <= MAX_MODEL_LEN
    assert [(e["custom_id"], e["response"]["body"]["error"]["code"]) for e in errors] == [
        ("given", "context_length_exceeded")]  # a max_tokens the client gave is not changed


def test_logprob_lines_carry_the_logprobs_an_interactive_request_gets(client: OpenAI, stack: Stack) -> None:
    lines = [("chat", CHAT, chat("Name a color.", max_tokens=6, logprobs=True, top_logprobs=2)),
             ("text", COMPLETIONS, completion("The sky is", max_tokens=6, logprobs=2))]
    batch = wait_for(client, submit(client, lines), finished, stack)
    answers = {o["custom_id"]: o["response"]["body"]["choices"][0] for o in file_lines(client, batch.output_file_id)}
    interactive = client.chat.completions.create(**lines[0][2]).choices[0].logprobs.content
    batched = answers["chat"]["logprobs"]["content"]
    assert [t["token"] for t in batched] == [t.token for t in interactive]
    assert max(abs(t["logprob"] - i.logprob) for t, i in zip(batched, interactive)) < 1e-3
    assert all(len(t["top_logprobs"]) == 2 for t in batched)
    text = answers["text"]["logprobs"]
    assert "".join(text["tokens"]) == answers["text"]["text"] and all(len(top) == 2 for top in text["top_logprobs"])


WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 16}}, "required": ["city"],
    "additionalProperties": False}}}


def test_tool_call_lines_give_whole_calls_and_a_cut_off_call_is_content(client: OpenAI, stack: Stack) -> None:
    named = {**chat("What's the weather in Paris?", max_tokens=48), "tools": [WEATHER_TOOL],
             "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    lines = [("named", CHAT, named), ("cut", CHAT, {**named, "max_tokens": 20})]
    batch = wait_for(client, submit(client, lines), finished, stack)
    answers = {o["custom_id"]: o["response"]["body"]["choices"][0] for o in file_lines(client, batch.output_file_id)}
    assert answers["named"]["finish_reason"] == "tool_calls" and answers["named"]["message"]["content"] is None
    [call] = answers["named"]["message"]["tool_calls"]  # exactly one call of the named function
    assert call["function"]["name"] == "get_weather" and isinstance(json.loads(call["function"]["arguments"]), dict)
    interactive = client.chat.completions.create(**named).choices[0].message.tool_calls or []
    assert [(c.function.name, c.function.arguments) for c in interactive] == [
        ("get_weather", call["function"]["arguments"])]
    cut = answers["cut"]
    assert cut["finish_reason"] == "length" and "tool_calls" not in cut["message"]
    assert cut["message"]["content"].startswith('{"name": "get_weather"') and "<" not in cut["message"]["content"]


def _kill(process: Process) -> None:
    os.killpg(process.popen.pid, signal.SIGKILL)
    process.popen.wait(10)


def test_worker_and_assembler_killed_mid_batch_still_answer_every_line_once(client: OpenAI, stack: Stack) -> None:
    lines = [(f"k-{i}", COMPLETIONS, completion(f"Line {i} of a poem:", max_tokens=8)) for i in range(30)]
    batch_id = submit(client, lines)
    before = wait_for(client, batch_id, lambda b: b.request_counts.completed >= 3, stack)
    assert before.status == "in_progress" and before.request_counts.completed < 30  # really mid-batch
    by_name = {p.name: p for p in stack.processes}
    for name in ("worker", "assembler"):
        _kill(by_name[name])
        stack.processes.remove(by_name[name])
    logs = Path(by_name["worker"].log).parent
    stack.processes.append(spawn_process("worker-2", ["worker"], stack.env, logs))
    stack.processes.append(spawn_process("assembler-2", ["batch", "assembler"], stack.env, logs))
    batch = wait_for(client, batch_id, finished, stack)
    assert batch.status == "completed" and batch.request_counts.completed == 30, batch
    output = file_lines(client, batch.output_file_id)
    assert sorted(o["custom_id"] for o in output) == sorted(cid for cid, *_ in lines)  # each exactly once
