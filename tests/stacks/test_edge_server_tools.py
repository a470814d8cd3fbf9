"""A server-side `python` call round trip with the official `openai` client: edge -> worker -> tool-intents ->
tool runner (sandbox) -> tool-results -> worker -> the next round -> edge, on the real broker and model.

The default model is tiny and was not trained for tools, so the tests name the tool in `tool_choice`: the
grammar then makes it call `python`. What is checked is the plumbing: the streamed tool_calls deltas, then the
result as a `specstream.tool_result` event with the same call id, then a final answer and a finish reason that
does not ask the client to answer the call (the server did).
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from streams.testing.stack import DEFAULT_MODEL as MODEL
from streams.testing.stack import Stack, running_stack, spawn_process
from tests.edge_support import WORKER_ENV, forced_server_call
from tests.kafka_fixtures import kafka_bootstrap, kafka_single  # noqa: F401  (pytest fixtures)

pytestmark = [pytest.mark.kafka, pytest.mark.model, pytest.mark.timeout(900)]

PYTHON_TOOL = {"type": "function", "function": {
    "name": "python", "description": "Run Python code and see what it prints.",
    "parameters": {"type": "object", "properties": {"code": {"type": "string", "maxLength": 60}},
                   "required": ["code"], "additionalProperties": False}}}
NAMED = {"type": "function", "function": {"name": "python"}}
ASK = [{"role": "user", "content": "What is 6 times 7? Compute it with python."}]


@pytest.fixture(scope="module")
def stack(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:  # noqa: F811
    logs: Path = tmp_path_factory.mktemp("stack")

    def start_tool_runner(stack: Stack) -> None:
        stack.processes.append(spawn_process("tool-runner", ["tool-runner"], stack.env, logs))

    # One round of tools, then the model must answer in words.
    env = {**WORKER_ENV, "SPECSTREAM_TOOLS__MAX_ROUNDS": "1"}
    with running_stack(kafka_bootstrap, env=env, prepare=start_tool_runner, log_dir=logs) as running:
        yield running


@pytest.fixture(scope="module")
def client(stack: Stack) -> OpenAI:
    return OpenAI(base_url=stack.base_url + "/v1", api_key=stack.api_key, max_retries=0, timeout=300)


def test_a_streamed_server_side_python_call_shows_the_call_its_result_and_a_final_answer(client: OpenAI) -> None:
    calls: dict[int, dict[str, Any]] = {}
    results: list[dict[str, Any]] = []
    content, finish = "", None
    order: list[str] = []
    # One call (parallel_tool_calls off), or the model goes on calling until max_tokens.
    for chunk in client.chat.completions.create(model=MODEL, messages=ASK, tools=[PYTHON_TOOL], tool_choice=NAMED,
                                                parallel_tool_calls=False, max_tokens=120, stream=True):
        extra = (chunk.model_extra or {}).get("specstream") or {}
        if "tool_result" in extra:
            results.append(extra["tool_result"])
            order.append("result")
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"id": delta.id, "name": "", "arguments": ""})
                if delta.function is not None:
                    call["name"] += delta.function.name or ""
                    call["arguments"] += delta.function.arguments or ""
                order.append("call")
            if choice.delta.content:
                content += choice.delta.content
                order.append("content")
            finish = choice.finish_reason or finish
    assert calls and calls[0]["name"] == "python" and "code" in json.loads(calls[0]["arguments"])
    assert len(results) == 1 and results[0]["tool_call_id"] == calls[0]["id"] and results[0]["name"] == "python"
    output = results[0]["output"]
    assert set(output) == {"stdout", "stderr", "exit_status"}, results[0]
    assert order.index("result") > order.index("call") and order[-1] == "content", order
    assert content.strip() and finish in ("stop", "length")


def test_a_non_streamed_server_side_call_lists_the_call_and_its_result(client: OpenAI) -> None:
    forced_server_call(client, MODEL, ASK, PYTHON_TOOL, max_tokens=120)


def test_a_tool_the_server_does_not_run_goes_back_to_the_client(client: OpenAI) -> None:
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}}}
    response = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather in Oslo?"}], tools=[weather],
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, parallel_tool_calls=False, max_tokens=60)
    assert response.choices[0].finish_reason == "tool_calls"
    assert response.choices[0].message.tool_calls[0].function.name == "get_weather"
    assert "tool_results" not in (response.model_extra or {})["specstream"]


def test_the_websocket_carries_the_server_side_call_its_result_and_the_answer(client: OpenAI) -> None:
    from websockets.sync.client import connect

    url = str(client.base_url).replace("http", "ws", 1).rstrip("/") + "/ws"
    frame = {"id": 3, "model": MODEL, "messages": ASK, "tools": [PYTHON_TOOL], "tool_choice": NAMED,
             "parallel_tool_calls": False, "max_tokens": 120}
    results: list[dict[str, Any]] = []
    with connect(url, additional_headers={"Authorization": f"Bearer {client.api_key}"}) as ws:
        ws.send(json.dumps(frame))
        while True:
            event = json.loads(ws.recv(timeout=300))
            assert event["type"] in ("chunk", "done"), event
            if event.get("tool_result") is not None:
                results.append(event["tool_result"])
            if event["type"] == "done":
                break
    assert len(results) == 1 and results[0]["name"] == "python"
    assert set(results[0]["output"]) == {"stdout", "stderr", "exit_status"}
    assert [r["tool_call_id"] for r in event["tool_results"]] == [results[0]["tool_call_id"]]
    assert event["finish_reason"] in ("stop", "length")
