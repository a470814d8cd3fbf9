"""Operations during the chaos run: LoRA adapter load/chat/unload rounds, and a canary rollout aborted at 50 %."""
from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.chaos.edge_calls import (
    CHAT,
    RETRY_STATUS,
    Json,
    as_json,
    count,
    error_of,
    kafka_settings,
    pause,
    request,
    sleep_until,
    why,
)
from bench.chaos.ledger import FlowContext, Tally
from streams.testing.stack import REPO, Process, _stop, spawn_process

OP_DEADLINE_S = 120.0


def _build_adapter(model: str, folder: Path) -> Path:
    """A random PEFT adapter of the served base model (small rank and std: its text stays text)."""
    import torch
    from transformers import AutoModelForCausalLM

    from engine.loader import resolve_model_dir
    from tests.lora_support import save_random_adapter

    hf = AutoModelForCausalLM.from_pretrained(resolve_model_dir(model), dtype=torch.float32).eval()
    return save_random_adapter(hf, folder, std=0.05, r=4, targets=["q_proj", "v_proj", "down_proj"])


class AdapterFlow:
    """``cycles`` load -> chat -> unload rounds spread over the run, each under a name of its own.

    Workers read the compacted adapters topic from its start at every start (streams/worker/service.py:124,
    from_beginning=True; a replayed load of a held path is skipped, streams/worker/adapters.py:61), so a worker
    restarted after a load serves the adapter again. But its request consumer starts alongside that listener, not
    after the replay: a chat taken by a just-restarted worker may get 404 model_not_found. That is an explicit
    error (errors, noted), not a loss; a 200 must name the adapter as its model."""

    def __init__(self, cycles: int = 2) -> None:
        self.cycles = cycles
        self.tally = Tally("adapters")
        self._task: asyncio.Task[None] | None = None
        self._op: str | None = None  # the operation under way: accepted, no outcome yet

    async def run(self, ctx: FlowContext, stop_at: float) -> None:
        self._task = asyncio.create_task(self._rounds(ctx, stop_at))
        await sleep_until(stop_at)

    async def _rounds(self, ctx: FlowContext, stop_at: float) -> None:
        folder = (ctx.log_dir / "adapter").resolve()
        try:
            await asyncio.to_thread(_build_adapter, ctx.model, folder)
        except Exception as error:  # noqa: BLE001 - said in a note; no round runs
            return self.tally.note(f"adapter not built: {type(error).__name__}: {error}")
        start, tag = time.monotonic(), uuid.uuid4().hex[:6]
        async with httpx.AsyncClient(timeout=180) as client:
            for k in range(self.cycles):
                await sleep_until(start + k * max(0.0, stop_at - start) / self.cycles)
                name = f"chaos-{tag}-{k}"
                if await self._registry(client, ctx, k, "load", {"lora_name": name, "lora_path": str(folder)}):
                    await self._chat(client, ctx, k, name)
                    await self._registry(client, ctx, k, "unload", {"lora_name": name})

    def _begin(self, op: str) -> None:
        self.tally.accepted, self._op = self.tally.accepted + 1, op

    def _end(self, outcome: str, note: str | None = None) -> bool:
        count(self.tally, outcome, note and f"{self._op}: {note}")
        self._op = None
        return outcome == "complete"

    async def _registry(self, client: httpx.AsyncClient, ctx: FlowContext, n: int, action: str, body: Json) -> bool:
        """A load or unload, repeated on a 5xx or no answer (a 504 leaves it registered: it applies later); after
        such a try, 'already loaded' / 'not found' means it took effect."""
        self._begin(f"{action} {body['lora_name']}")
        done, tried, last, attempt = "lora_already_loaded" if action == "load" else "lora_not_found", False, "", 0
        deadline = time.monotonic() + OP_DEADLINE_S
        while time.monotonic() < deadline:
            try:
                response = await client.post(ctx.base_url(n + attempt) + f"/v1/{action}_lora_adapter", json=body,
                                             headers=ctx.headers)
            except httpx.TransportError as error:
                tried |= not isinstance(error, (httpx.ConnectError, httpx.ConnectTimeout))
            else:
                status, answer = response.status_code, as_json(response)
                code, last = error_of(answer).get("code"), why(status, answer)
                if status == 200 or (code == done and tried):
                    return self._end("complete", None if status == 200 else f"{last} after an unanswered try")
                tried |= status in RETRY_STATUS
                # An unload's 404 before any try: this edge may not have heard restarted workers announce it yet.
                if status not in RETRY_STATUS and not (action == "unload" and code == done):
                    return self._end("errors", last)
            attempt += 1
            await asyncio.sleep(pause(attempt))
        return self._end("errors" if last else "lost", f"{last or 'no answer'} after {OP_DEADLINE_S:g} s")

    async def _chat(self, client: httpx.AsyncClient, ctx: FlowContext, n: int, name: str) -> None:
        self._begin(f"chat on {name}")
        body = {"model": name, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8,
                "temperature": 0}
        try:  # generating changes nothing: retried like a read
            response = await request(client, ctx, "POST", CHAT, deadline=time.monotonic() + OP_DEADLINE_S, n=n,
                                     json=body)
        except httpx.TransportError as error:
            self._end("lost", f"no answer ({type(error).__name__})")
            return
        answer = as_json(response)
        if response.status_code != 200:
            self._end("errors", why(response.status_code, answer))
        elif not (answer.get("choices") or [{}])[0].get("message") or answer.get("model") != name:
            self._end("wrong", str(answer)[:150])
        else:
            self._end("complete")

    async def settle(self, ctx: FlowContext, timeout_s: float) -> Tally:
        if self._task is not None:
            await asyncio.wait({self._task}, timeout=timeout_s)
            if not self._task.done():
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
            elif self._task.exception() is not None:
                self.tally.note(f"rounds stopped: {self._task.exception()!r}")
            if self._op is not None:
                self._end("lost", f"no outcome when settle's {timeout_s:g} s ran out")
        return self.tally


# --- canary rollout ----------------------------------------------------------------------------------------------

AT_50 = r"^rollout \w+: running, 50 % to the candidate"  # this process's own line (tests/stacks/test_rollout.py)
CANDIDATE_PID = re.compile(r"^candidate-\S+: started \(pid (\d+)\)", re.MULTILINE)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class RolloutFlow:
    """At ``start_after_s``: `rollout start` of a one-worker candidate pool (steps 50,100, each held 10 min), left at
    50 % for ``hold_s``, then `rollout abort`: it must exit with the state aborted at 0 % and no worker left."""

    def __init__(self, start_after_s: float = 40.0, hold_s: float = 30.0) -> None:
        self.start_after_s, self.hold_s = start_after_s, hold_s
        self.tally = Tally("rollout")
        self.process: Process | None = None
        self.outcome: tuple[str, str | None] = ("lost", "no outcome")
        self._task: asyncio.Task[None] | None = None

    async def run(self, ctx: FlowContext, stop_at: float) -> None:
        self._task = asyncio.create_task(self._scenario(ctx, time.monotonic() + self.start_after_s))
        await sleep_until(stop_at)

    async def _scenario(self, ctx: FlowContext, start_at: float) -> None:
        await sleep_until(start_at)
        folder, kafka = (ctx.log_dir / "rollout").resolve(), kafka_settings(ctx)
        folder.mkdir(parents=True, exist_ok=True)
        # The candidate's file is its whole configuration (streams/ops/rollout.py:92-102 drops SPECSTREAM_*__*):
        # stable's overrides that it needs (WORKER_ENV, the cluster's replication) are repeated here.
        config = folder / "candidate.yaml"
        config.write_text(yaml.safe_dump({
            "engine": {"model": ctx.model, "max_model_len": 512, "kv_cache_bytes": "96MiB"},
            "worker": {"heartbeat_s": 1.0},
            "kafka": {"replication_factor": kafka.replication_factor,
                      "min_insync_replicas": kafka.min_insync_replicas}}))
        self.process = spawn_process("rollout", [
            "rollout", "start", "--candidate", str(config), "--log-dir", str(folder), "--interval", "0.5",
            "--steps", "50,100", "--hold", "10m", "--workers", "1"], ctx.env, folder)
        self.tally.accepted = 1
        if not await self._wait_line(AT_50, 420.0):
            self.outcome = ("errors", f"never at 50 % (exit {self.process.popen.poll()}): {self.process.tail(6)}")
            return
        await asyncio.sleep(self.hold_s)
        aborted = await _abort(ctx)
        code = await asyncio.to_thread(_wait_exit, self.process, 180.0)
        if code is None:
            self.outcome = ("lost", f"still running 180 s after `rollout abort` ({aborted}): {self.process.tail(6)}")
            return
        state = await _rollout_state(ctx)
        if ("aborted (chaos)" in self.process.log.read_text(errors="replace") and state is not None
                and (state.state, state.percent) == ("aborted", 0.0)):
            self.outcome = ("complete", None)
        elif state is not None and (state.state, state.percent) == ("rolled_back", 0.0):
            # Its gates took it back before the abort: to the candidate and back all the same.
            self.outcome = ("complete", f"rolled back by its gates: {state.reason}")
        else:
            self.outcome = ("errors", f"exit {code}, state {state and (state.state, state.percent, state.reason)}, "
                            f"abort {aborted}: {self.process.tail(6)}")

    async def _wait_line(self, pattern: str, timeout_s: float) -> bool:
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.process.popen.poll() is None:
            if re.search(pattern, self.process.log.read_text(errors="replace"), re.MULTILINE):
                return True
            await asyncio.sleep(0.5)
        return False

    async def settle(self, ctx: FlowContext, timeout_s: float) -> Tally:
        if self._task is None or self.process is None:  # not spawned yet: not started during settle either
            failed = self._task is not None and self._task.done() and self._task.exception()
            if self._task is not None:
                self._task.cancel()
            self.tally.note(f"the rollout never started: {failed!r}" if failed else
                            f"the rollout never started (a run shorter than {self.start_after_s:g} s?)")
            return self.tally
        await asyncio.wait({self._task}, timeout=timeout_s)
        if not self._task.done():
            self._task.cancel()
            self.outcome = ("lost", f"no outcome within settle's {timeout_s:g} s: {self.process.tail(4)}")
        elif self._task.exception() is not None:
            self.outcome = ("errors", f"scenario failed: {self._task.exception()!r}")
        ended_itself = self.process.popen.poll() is not None
        left = await asyncio.to_thread(self._clean_up)
        if left and ended_itself and self.outcome[0] != "lost":
            self.outcome = ("wrong", f"candidate worker(s) {left} outlived `rollout start`")
        count(self.tally, *self.outcome)
        return self.tally

    def _clean_up(self) -> list[int]:
        """Stop `rollout start` if it still runs (SIGTERM: it rolls back and drains its pool, else its group is
        killed), then any candidate worker still alive; those are returned."""
        assert self.process is not None
        _stop(self.process, 90.0)
        left = [pid for pid in map(int, CANDIDATE_PID.findall(self.process.log.read_text(errors="replace")))
                if _alive(pid)]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in (p for p in left if _alive(p)):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, sig)
            deadline = time.monotonic() + 60
            while any(_alive(pid) for pid in left) and time.monotonic() < deadline:
                time.sleep(0.5)
        return left


def _wait_exit(process: Process, timeout_s: float) -> int | None:
    with contextlib.suppress(Exception):
        return process.popen.wait(timeout_s)
    return None


async def _abort(ctx: FlowContext) -> str:
    """`rollout abort --reason chaos`, tried up to 3 times (a broker may be out): its exit status and last line."""
    said = ""
    for attempt in range(3):
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "streams.cli", "rollout", "abort", "--reason", "chaos", env=ctx.env, cwd=REPO,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        try:
            out, _ = await asyncio.wait_for(child.communicate(), 120)
        except TimeoutError:
            child.kill()
            out = b"(no exit within 120 s)"
            await child.wait()
        said = f"exit {child.returncode}: {(out.decode(errors='replace').strip().splitlines() or [''])[-1]}"
        if child.returncode == 0 or "cannot abort" in said:
            break
        await asyncio.sleep(5.0 * (attempt + 1))
    return said


async def _rollout_state(ctx: FlowContext) -> Any:
    from schemas.topics import TopicCatalog
    from streams.ops.rollout_store import read_states

    with contextlib.suppress(Exception):  # unreadable: None, and the outcome says so
        return (await read_states(kafka_settings(ctx), TopicCatalog(ctx.topic_prefix))).get(ctx.model)
    return None

