"""Carrying out the chaos schedule on a running deployment, and the poison it injects (so the dead-letter check
can tell injected poison from anything else)."""
from __future__ import annotations

import asyncio
import json
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from bench.chaos.chat_flows import EdgeFaults
from bench.chaos.deployment import MAX_MESSAGE_BYTES, Deployment
from bench.chaos.ledger import say
from bench.chaos.schedule import Fault

# The group-consumed inputs: poison there is dead-lettered. The others (read by every worker without a group, the
# compacted tables, the edges' reply topics) are skipped and counted by their readers.
DEAD_LETTERED = ("requests", "batch_lines", "ingest_jobs", "document_chunks", "retrieval", "index_commands",
                 "tool_intents", "batch_results")
SKIPPED = ("cancellations", "tool_results", "adapters", "services", "files", "vector_stores", "documents", "batches",
           "rollouts", "edges")


def poison_payloads(round_: int) -> dict[str, bytes]:
    return {
        "malformed": b'{"request_id": "poison", "model": ',
        "version": json.dumps({"schema_version": 99, "request_id": f"poison-{round_}"}).encode(),
        "oversized": json.dumps({"schema_version": 1, "pad": "x" * (MAX_MESSAGE_BYTES + 4096)}).encode(),
    }


@dataclass
class Injected:
    """Poison sent: (topic, key) pairs expected on the dead-letter topic, and those sent where readers skip it."""

    dead_lettered: set[tuple[str, str]] = field(default_factory=set)
    skipped: set[tuple[str, str]] = field(default_factory=set)
    deleted_topics: set[str] = field(default_factory=set)  # replies meant for them are dead-lettered, naming them


@dataclass
class FaultRunner:
    deployment: Deployment
    cluster: Any  # infra.kafka.broker.ClusterSpec
    edge_faults: EdgeFaults
    injected: Injected = field(default_factory=Injected)
    done: list[tuple[float, Fault]] = field(default_factory=list)  # (time.time() it began, fault)
    busy: set[str] = field(default_factory=set)  # services being restarted now (their exit is the fault's)
    started_wall: float = 0.0
    _rounds: int = 0

    async def run(self, schedule: list[Fault], started: float) -> None:
        """Each fault at its offset from `started` (time.monotonic()), each on its own: a broker held down for 20 s
        does not delay the kills due meanwhile (the schedule keeps conflicting faults apart)."""
        self.started_wall = time.time() - (time.monotonic() - started)
        await asyncio.gather(*(self._apply(fault, started) for fault in schedule))

    async def _apply(self, fault: Fault, started: float) -> None:
        await asyncio.sleep(max(0.0, started + fault.at_s - time.monotonic()))
        say(f"fault: {fault.describe()}")
        self.done.append((time.time(), fault))
        try:
            await getattr(self, "_" + fault.kind.replace("-", "_"))(fault)
        except Exception as error:  # noqa: BLE001 - a fault that could not be applied is reported, not fatal
            say(f"fault {fault.describe()} failed: {type(error).__name__}: {error}")

    def _edge_index(self, name: str) -> int | None:
        edges = [e.name for e in self.deployment.edges()]
        return edges.index(name) if name in edges else None

    async def _restart(self, fault: Fault, sig: signal.Signals) -> None:
        service = self.deployment.services[fault.target]
        if (edge := self._edge_index(fault.target)) is not None:
            self.edge_faults.at[edge].append(time.time())
        self.busy.add(service.name)
        try:
            service.signal(sig)
            await asyncio.to_thread(service.wait_exit, 60.0)
            await asyncio.sleep(fault.hold_s)
            service.start()
        finally:
            self.busy.discard(service.name)

    async def _kill(self, fault: Fault) -> None:
        await self._restart(fault, signal.SIGKILL)

    async def _term(self, fault: Fault) -> None:
        await self._restart(fault, signal.SIGTERM)

    async def _broker_kill(self, fault: Fault) -> None:
        from infra.kafka.broker import kill_node, start_node

        victim = await self._leader()
        say(f"  kill -9 broker {victim} (leads most request partitions) for {fault.hold_s:g}s")
        await asyncio.to_thread(kill_node, self.cluster, victim)
        await asyncio.sleep(fault.hold_s)
        await asyncio.to_thread(start_node, self.cluster, victim)

    async def _broker_pause(self, fault: Fault) -> None:
        from infra.kafka.broker import kill_node

        victim = await self._leader()
        say(f"  SIGSTOP broker {victim} for {fault.hold_s:g}s")
        await asyncio.to_thread(kill_node, self.cluster, victim, signal.SIGSTOP)
        try:
            await asyncio.sleep(fault.hold_s)
        finally:
            await asyncio.to_thread(kill_node, self.cluster, victim, signal.SIGCONT)

    async def _leader(self) -> int:
        from streams.testing.reliability import leading_broker

        return await leading_broker(self.deployment.bootstrap, f"{self.deployment.prefix}.requests")

    async def _redis_restart(self, fault: Fault) -> None:
        redis = self.deployment.redis
        await asyncio.to_thread(redis.kill)
        await asyncio.sleep(fault.hold_s)
        await asyncio.to_thread(redis.start)

    async def _reply_topic_delete(self, fault: Fault) -> None:
        from streams.kafka.clients import delete_topics

        if (edge := self._edge_index(fault.target)) is not None:
            self.edge_faults.at[edge].append(time.time())
        topic = f"{self.deployment.prefix}.replies.{self.deployment.prefix}-{fault.target}"
        self.injected.deleted_topics.add(topic)
        await delete_topics(self.deployment.bootstrap, [topic])

    async def _poison(self, fault: Fault) -> None:
        """Malformed, unknown-version and oversized messages on every input topic (and the edges' reply topics)."""
        from schemas.topics import TopicCatalog
        from streams.kafka.clients import make_producer

        self._rounds += 1
        catalog = TopicCatalog(prefix=self.deployment.prefix)
        topics = {name: getattr(catalog, name).name for name in DEAD_LETTERED + SKIPPED}
        for edge in self.deployment.edges():
            topics[f"replies of {edge.name}"] = catalog.replies(f"{self.deployment.prefix}-{edge.name}").name
        producer = make_producer(self.deployment.bootstrap, client_id="chaos-poison", max_request_size=2 * 1024 * 1024)
        await producer.start()
        try:
            for name, topic in topics.items():
                for what, payload in poison_payloads(self._rounds).items():
                    key = f"chaos-poison-{self._rounds}-{what}"
                    await producer.send_and_wait(topic, payload, key=key.encode())
                    (self.injected.dead_lettered if name in DEAD_LETTERED else self.injected.skipped).add((topic, key))
        finally:
            await producer.stop()
