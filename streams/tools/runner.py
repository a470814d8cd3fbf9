"""The tool runner: a consumer on the foundation that executes ToolIntents and publishes ToolResults.

    tool-intents ──► foundation (intake, dead letters, slot) ──► checks (allowlist, tenant, JSON schema)
        ──► executor (calculator in process; python in the sandbox; file_search through the rag service's retriever)
        ──► ToolResult on tool-results, keyed by call_id

Every intent gets exactly one answer from the runner that finishes it: its result, or a refusal
(``unknown_tool``, ``permission_denied``, ``rejected`` with the schema's message, ``deadline_exceeded``). The
intent's offset is committed only once its result is acknowledged, so a runner killed mid-call leaves it to be
redelivered and run again; the worker takes the first result of each call id it waits for and ignores the rest.
A copy of an intent redelivered after its result was acknowledged (its commit was lost: a rebalance, a broker
failing over) is not answered again; a new intent for a call answered here (a regenerated request) is.
A runner refuses to start, in one line, when the sandbox cannot be built here.
"""
from __future__ import annotations

import asyncio
import collections
import json
import logging
import time

from faststream import FastStream

from schemas.tools import ToolError, ToolIntent, ToolResult
from streams.config import Settings
from streams.kafka.acls import tool_runner_grants
from streams.service import Consumer, Delivery, Output, ServiceOptions
from streams.service.app import create_app as create_service_app
from streams.service.app import serve
from streams.service.runner import ConsumerService
from streams.tools.checks import refusal
from streams.tools.executors import ToolOutcome, calculate, run_python
from streams.tools.file_search import FileSearcher
from streams.tools.sandbox import Sandbox

log = logging.getLogger("specstream.tools")

TOOL_RUNNER_KIND = "tool-runner"
# Results of the calls answered here lately: an intent published again for a call this runner answered (a copy
# redelivered after its result was published, or a regenerated request's worker asking again) gets the same
# result published again, without running the call twice. Bounded: a result holds up to a tool's output limit.
_REMEMBERED_CALLS = 1_000


class ToolRunner:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        tools = settings.tools
        self.runner_id = tools.runner.resolved_id()
        self.sandbox = Sandbox(tools.sandbox, slots=tools.runner.max_inflight)
        self.file_search = FileSearcher(settings, self.runner_id)
        # call id -> (what was asked, its result)
        self._answered: collections.OrderedDict[str, tuple[tuple[str, str, str], ToolResult]] = \
            collections.OrderedDict()
        # The intents (partition, offset) whose result Kafka acknowledged: a redelivered copy needs no second one.
        self._acknowledged: collections.OrderedDict[tuple[int, int], None] = collections.OrderedDict()
        catalog = settings.catalog
        self.results_topic = catalog.tool_results.name
        self.service = ConsumerService(ServiceOptions.from_settings(settings, tools.runner), Consumer(
            kind=TOOL_RUNNER_KIND, topic=catalog.tool_intents, input_model=ToolIntent, handle=self._on_intent,
            outputs=[Output(catalog.tool_results, ToolResult)],
            group_id=tools.runner.resolved_group_id(settings.kafka.topic_prefix),
            key_of=lambda intent: intent.call_id, prepare=self._check_sandbox, grants=tool_runner_grants,
        ))

    async def _check_sandbox(self) -> None:
        """Before any intent is read: a registry with sandboxed tools needs a sandbox that works here."""
        if any(tool.executor == "python" for tool in self.settings.tools.registry.values()):
            await self.sandbox.check()  # SandboxUnavailable stops the start, in one line
            if not self.sandbox.drops_privileges:
                log.warning("the tool runner is not root: calls run as its own user, so their process limit "
                            "counts this user's processes too (see docs/tools.md)")
            if self.sandbox.seccomp is None:
                log.warning("no seccomp filter on this machine (x86-64 only, or tools.sandbox.seccomp false)")
        log.info("tool runner %s: tools %s, intents from %s", self.runner_id,
                 ", ".join(sorted(self.settings.tools.registry)) or "none", self.settings.catalog.tool_intents.name)

    async def _on_intent(self, intent: ToolIntent, delivery: Delivery) -> None:
        where = (delivery.source.partition, delivery.source.offset)
        if where in self._acknowledged:
            log.info("call %s: this intent (%s) was answered and acknowledged already; not answered again",
                     intent.call_id, delivery.source)
            return
        answered = self._answered.get(intent.call_id)
        if answered is not None and answered[0] == _asked(intent):  # not for another tenant or other arguments
            log.info("call %s was answered here already; its result is published again", intent.call_id)
            self._publish(delivery, intent.call_id, answered[1])
            return
        started = time.monotonic()
        log.info("running call %s (%s, tenant %s)", intent.call_id, intent.tool, intent.tenant)
        outcome = await self.outcome(intent)
        result = ToolResult(request_id=intent.request_id, call_id=intent.call_id, tool=intent.tool,
                            output=outcome.output, error=outcome.error, truncated=outcome.truncated,
                            duration_s=time.monotonic() - started, runner_id=self.runner_id)
        log.info("call %s (%s, tenant %s): %s in %.3f s", intent.call_id, intent.tool, intent.tenant,
                 outcome.error.code if outcome.error else "ok", result.duration_s)
        self._publish(delivery, intent.call_id, result)
        self._answered[intent.call_id] = (_asked(intent), result)
        while len(self._answered) > _REMEMBERED_CALLS:
            self._answered.popitem(last=False)

    def _publish(self, delivery: Delivery, call_id: str, result: ToolResult) -> None:
        delivery.publish(self.results_topic, call_id.encode(), result)
        where = (delivery.source.partition, delivery.source.offset)
        delivery.published[-1].add_done_callback(lambda ack: self._acknowledge(where, ack))

    def _acknowledge(self, where: tuple[int, int], ack: asyncio.Future[object]) -> None:
        if ack.cancelled() or ack.exception() is not None:
            return  # not on the bus: a redelivered copy must be answered
        self._acknowledged[where] = None
        while len(self._acknowledged) > _REMEMBERED_CALLS:
            self._acknowledged.popitem(last=False)

    async def outcome(self, intent: ToolIntent) -> ToolOutcome:
        if intent.deadline is not None and intent.deadline <= time.time():
            return ToolOutcome(error=ToolError(code="deadline_exceeded",
                                           message=f"the deadline passed {time.time() - intent.deadline:.3f} s "
                                           "before the call was read"))
        refused = refusal(intent, self.settings.tools.registry)
        if refused is not None:
            return ToolOutcome(error=refused)
        tool = self.settings.tools.registry[intent.tool]
        match tool.executor:
            case "calculator":
                return calculate(intent.arguments)
            case "python":
                return await run_python(tool, intent.arguments, self.sandbox, self.settings.tools.sandbox.python)
            case "file_search":
                # Within the tool's timeout, and within what is left of the intent's deadline.
                budget = tool.timeout_s if intent.deadline is None else min(tool.timeout_s, intent.deadline - time.time())
                return await self.file_search.run(tool, intent.arguments, intent.tenant, budget)

    async def start(self) -> None:
        await self.service.start()

    async def stop(self) -> None:
        await self.service.stop()
        await self.file_search.close()

    async def __aenter__(self) -> ToolRunner:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def _asked(intent: ToolIntent) -> tuple[str, str, str]:
    return intent.tool, intent.tenant, json.dumps(intent.arguments, sort_keys=True)


def create_app(settings: Settings) -> tuple[FastStream, ToolRunner]:
    runner = ToolRunner(settings)
    return create_service_app(runner.service), runner


async def run_tool_runner(settings: Settings) -> None:
    """Serve until SIGINT/SIGTERM, then drain and stop."""
    await serve(ToolRunner(settings).service)


__all__ = ["TOOL_RUNNER_KIND", "ToolRunner", "create_app", "run_tool_runner"]
