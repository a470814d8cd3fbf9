"""One Batch API job during the chaos run: every line exactly one output or error line."""
from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import time
import uuid

import httpx

from bench.chaos.edge_calls import (
    CHAT,
    Json,
    as_json,
    count,
    create,
    finder,
    request,
    sleep_until,
    why,
)
from bench.chaos.ledger import FlowContext, Tally
from streams.batch.validation import dumps_line
from streams.testing.reliability import PROMPTS

TERMINAL = ("completed", "failed", "expired", "cancelled")


class BatchFlow:
    """One chat batch of ``lines`` greedy 4-token lines, created early in the run; settle matches its files."""

    def __init__(self, lines: int = 200) -> None:
        self.lines = lines
        self.tally = Tally("batch")
        self.batch_id: str | None = None
        self.custom_ids: list[str] = []

    async def run(self, ctx: FlowContext, stop_at: float) -> None:
        tag = uuid.uuid4().hex[:8]
        self.custom_ids = [f"chaos-{tag}-{i}" for i in range(self.lines)]
        data = "\n".join(dumps_line(cid, CHAT, {
            "model": ctx.model, "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
            "max_tokens": 4, "temperature": 0}) for i, cid in enumerate(self.custom_ids)).encode()
        name = f"chaos-batch-{tag}.jsonl"
        async with httpx.AsyncClient(timeout=120) as client:
            status, body, _ = await create(client, ctx, "/v1/files", deadline=stop_at, data={"purpose": "batch"},
                                           find=finder(client, ctx, "/v1/files?purpose=batch", "filename", name),
                                           files={"file": (name, data, "application/jsonl")})
            if status // 100 == 2:  # two batches of one file would run it twice: resent only when none is listed
                status, body, found = await create(
                    client, ctx, "/v1/batches", deadline=stop_at,
                    find=finder(client, ctx, "/v1/batches?limit=100", "input_file_id", body["id"]),
                    json={"input_file_id": body["id"], "endpoint": CHAT, "completion_window": "24h",
                          "metadata": {"chaos": tag}})
                if found:
                    self.tally.note(f"batch {body['id']}: its create went unanswered; found listed, not resent")
        if status // 100 != 2:
            return self.tally.note(f"no batch: {why(status, body)}")
        self.batch_id, self.tally.accepted = body["id"], self.lines
        await sleep_until(stop_at)

    async def settle(self, ctx: FlowContext, timeout_s: float) -> Tally:
        deadline, batch = time.monotonic() + timeout_s, {}
        if self.batch_id is None:
            return self.tally
        async with httpx.AsyncClient(timeout=120) as client:
            while batch.get("status") not in TERMINAL and time.monotonic() < deadline:
                with contextlib.suppress(httpx.TransportError):
                    response = await request(client, ctx, "GET", f"/v1/batches/{self.batch_id}", deadline=deadline)
                    batch = as_json(response) if response.status_code == 200 else batch
                await asyncio.sleep(0 if batch.get("status") in TERMINAL else 2.0)
            output, errors = [await self._lines(client, ctx, batch.get(f"{k}_file_id"), deadline)
                              for k in ("output", "error")]
        if batch.get("status") not in TERMINAL:
            self.tally.note(f"{self.batch_id} not ended in time: {batch.get('status')} {batch.get('request_counts')}")
        if output is None or errors is None:
            self.tally.note(f"{self.batch_id}: its output or error file could not be read (its lines count as lost)")
        if batch.get("status") == "failed" and not output and not errors:
            self.tally.errors = self.lines
            self.tally.note(f"{self.batch_id} failed as a whole: {batch.get('errors')}")
            return self.tally
        self._match(output or [], errors or [])
        counts = batch.get("request_counts") or {}
        if (counts.get("completed"), counts.get("failed")) != (len(output or []), len(errors or [])):
            self.tally.note(f"request_counts {counts}, files: {len(output or [])} output, {len(errors or [])} errors")
        return self.tally

    async def _lines(self, client: httpx.AsyncClient, ctx: FlowContext, file_id: str | None,
                     deadline: float) -> list[Json] | None:
        if not file_id:
            return []
        with contextlib.suppress(httpx.TransportError, ValueError):
            response = await request(client, ctx, "GET", f"/v1/files/{file_id}/content",
                                     deadline=max(deadline, time.monotonic() + 60))
            if response.status_code == 200:
                return [json.loads(line) for line in response.text.splitlines() if line.strip()]
        return None

    def _match(self, output: list[Json], errors: list[Json]) -> None:
        """Each custom_id once across both files: an output line with text (complete), or an error line."""
        seen = collections.Counter(line.get("custom_id") for line in output + errors)
        ours = set(self.custom_ids)
        for line in (line for line in output if seen[line.get("custom_id")] == 1 and line.get("custom_id") in ours):
            response = line.get("response") or {}
            choice = ((response.get("body") or {}).get("choices") or [{}])[0]
            if response.get("status_code") == 200 and (choice.get("message") or {}).get("content"):
                self.tally.complete += 1
            else:
                count(self.tally, "wrong", f"{line.get('custom_id')}: output line {str(response)[:150]}")
        self.tally.errors += sum(seen[line.get("custom_id")] == 1 and line.get("custom_id") in ours for line in errors)
        for cid in (cid for cid in self.custom_ids if seen[cid] != 1):
            count(self.tally, "lost" if seen[cid] == 0 else "doubled", f"{cid}: in the files {seen[cid]} times")
        for cid in set(seen) - ours:
            count(self.tally, "wrong", f"unknown custom_id {cid!r} in the files")


