"""The chaos run's tool traffic: chats whose model is made to call the python tool (run by the tool runner in its
sandbox), chats grounded by file_search (through the retriever), and, on the bus, one result per tool intent."""
from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass
from typing import Any

import httpx

from bench.chaos.chat_flows import Drop, EdgeFaults
from bench.chaos.ledger import FlowContext, Tally, say

PYTHON_TOOL = {"type": "function", "function": {"name": "python", "parameters": {
    "type": "object", "properties": {"code": {"type": "string", "maxLength": 60}}, "required": ["code"],
    "additionalProperties": False}}}
DOCUMENT = ("Kafka keeps every record of a topic partition in order. Consumers in one group share the partitions "
            "of a topic, and a partition moves to another consumer when its owner dies. The blue heron of lake "
            "Ontario nests in tall trees near the shore.")


@dataclass
class Outcome:
    kind: str  # complete | error | dropped | wrong
    detail: str = ""


class _HttpLoop:
    """A closed-loop client posting non-streamed chats, alternating edges; `check` judges each 200 body."""

    name = ""

    def __init__(self, faults: EdgeFaults, pause_s: float) -> None:
        self.faults, self.pause_s = faults, pause_s
        self.outcomes: list[Outcome] = []

    def body(self, ctx: FlowContext) -> dict[str, Any]:
        raise NotImplementedError

    def check(self, body: dict[str, Any]) -> Outcome:
        raise NotImplementedError

    async def run(self, ctx: FlowContext, stop_at: float) -> None:
        n = 0
        async with httpx.AsyncClient(timeout=httpx.Timeout(300.0, connect=10)) as client:
            while time.monotonic() < stop_at:
                n += 1
                edge = n % len(ctx.base_urls)
                try:
                    response = await client.post(ctx.base_url(edge) + "/v1/chat/completions", json=self.body(ctx),
                                                 headers=ctx.headers)
                except httpx.ConnectError:
                    await asyncio.sleep(1.0)  # never reached an edge: not accepted, the next try goes to the other
                    continue
                except (httpx.HTTPError, OSError) as error:
                    drop = Drop(time.time(), edge)
                    self.outcomes.append(Outcome("dropped" if self.faults.explains(drop) else "lost",
                                                 f"{type(error).__name__}: {error}"))
                    await asyncio.sleep(1.0)
                    continue
                if response.status_code != 200:
                    self.outcomes.append(Outcome("error", f"{response.status_code} {response.text[:160]}"))
                else:
                    self.outcomes.append(self.check(response.json()))
                await asyncio.sleep(self.pause_s)

    def settle(self) -> Tally:
        tally = Tally(self.name, accepted=len(self.outcomes))
        for outcome in self.outcomes:
            field_name = {"complete": "complete", "error": "errors", "dropped": "dropped", "lost": "lost",
                          "wrong": "wrong"}[outcome.kind]
            setattr(tally, field_name, getattr(tally, field_name) + 1)
            if outcome.kind != "complete":
                tally.note(f"{outcome.kind}: {outcome.detail}")
        return tally


class PythonToolFlow(_HttpLoop):
    """The model is made to call `python` (tool_choice names it); the tool runner answers the call exactly once."""

    name = "python tool chats"

    def body(self, ctx: FlowContext) -> dict[str, Any]:
        return {"model": ctx.model, "messages": [{"role": "user", "content": "Print the sum of 2 and 3 in Python."}],
                "tools": [PYTHON_TOOL], "tool_choice": {"type": "function", "function": {"name": "python"}},
                "parallel_tool_calls": False, "max_tokens": 80, "temperature": 0}

    def check(self, body: dict[str, Any]) -> Outcome:
        message = body["choices"][0]["message"]
        calls = message.get("tool_calls") or []
        results = (body.get("specstream") or {}).get("tool_results") or []
        if len(calls) != 1 or [r["tool_call_id"] for r in results] != [calls[0]["id"]]:
            return Outcome("wrong", f"calls {[c['id'] for c in calls]}, results {results}")
        if results[0].get("error"):
            return Outcome("error", f"tool error {results[0]['error']}")
        return Outcome("complete")


class FileSearchFlow(_HttpLoop):
    """Chats grounded on a store of one document (file_search through the retriever): answered with citations."""

    name = "file_search chats"

    def __init__(self, faults: EdgeFaults, pause_s: float) -> None:
        super().__init__(faults, pause_s)
        self.store = ""

    async def prepare(self, ctx: FlowContext) -> None:
        async with httpx.AsyncClient(base_url=ctx.base_url(0), headers=ctx.headers, timeout=60) as client:
            file = (await client.post("/v1/files", files={"file": ("heron.txt", DOCUMENT.encode())},
                                      data={"purpose": "assistants"})).raise_for_status().json()
            store = (await client.post("/v1/vector_stores", json={"name": "chaos-grounding",
                                                                  "file_ids": [file["id"]]})).raise_for_status().json()
            self.store = store["id"]
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                counts = (await client.get(f"/v1/vector_stores/{self.store}")).raise_for_status().json()["file_counts"]
                if counts["completed"] == 1:
                    return
                await asyncio.sleep(1.0)
        raise TimeoutError(f"grounding store {self.store} not indexed in 180 s")

    def body(self, ctx: FlowContext) -> dict[str, Any]:
        return {"model": ctx.model, "messages": [{"role": "user", "content": "Where does the blue heron nest?"}],
                "tools": [{"type": "file_search", "vector_store_ids": [self.store], "max_num_results": 2}],
                "max_tokens": 16, "temperature": 0}

    def check(self, body: dict[str, Any]) -> Outcome:
        annotations = body["choices"][0]["message"].get("annotations") or []
        versions = (body.get("specstream") or {}).get("index_versions") or {}
        if self.store not in versions:
            return Outcome("wrong", f"index_versions {versions} lacks {self.store}")
        if not any(a.get("type") == "file_citation" for a in annotations):
            return Outcome("wrong", "no file_citation")
        return Outcome("complete")


async def intent_ledger(ctx: FlowContext) -> Tally:
    """On the bus: every tool intent has exactly one result. A call's intent is published again when its request
    is regenerated (its worker died in the tool round), and each copy is answered: results per call id must equal
    intents per call id."""
    from schemas.tools import ToolIntent, ToolResult
    from schemas.topics import TopicCatalog
    from streams.kafka import clients
    from tests.edge_support import topic_records

    catalog = TopicCatalog(prefix=ctx.topic_prefix)
    counts: dict[str, collections.Counter[str]] = {"intents": collections.Counter(), "results": collections.Counter()}
    for topic, model, kind in ((catalog.tool_intents.name, ToolIntent, "intents"),
                               (catalog.tool_results.name, ToolResult, "results")):
        for record in await topic_records(ctx.bootstrap, topic):
            try:
                counts[kind][clients.decode(record.value, model).call_id] += 1
            except Exception:  # noqa: BLE001 - the injected poison
                continue
    intents, results = counts["intents"], counts["results"]
    tally = Tally("tool intents (bus)", accepted=sum(intents.values()))
    for call, asked in intents.items():
        answered = results[call]
        tally.complete += min(asked, answered)
        tally.lost += max(0, asked - answered)
        tally.doubled += max(0, answered - asked)
        if answered != asked:
            tally.note(f"{call}: {asked} intent(s), {answered} result(s)")
    say(f"tool intents: {tally.accepted} for {len(intents)} calls, {sum(results.values())} results")
    return tally
