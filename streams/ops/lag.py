"""What the autoscaler sees: the worker group's lag on the request topic, and what the workers hold in flight.

* **lag** = end offset - committed offset of the worker group, summed over the request topic's partitions (aiokafka:
  ``AIOKafkaAdminClient.list_consumer_group_offsets`` and ``AIOKafkaConsumer.end_offsets``). A partition the group
  never committed counts from its first offset (``offsetResetPolicy: earliest``, as the workers read).
* **in flight** = the ``in_flight`` of the newest announcement of every live engine worker on the compacted
  ``<prefix>.services`` topic. Before any worker announces itself there (older workers announce on the workers
  topic, without counts), it is 0 and :attr:`Observation.announced` says so.

specstream's workers commit a request's offset only once its answer is stored, so the lag already counts every
request a worker has read and not answered; the in-flight figure is the guard for consumers that commit on read
(:class:`streams.ops.scaling.ScalePolicy` ``in_flight_in_lag``).

One :class:`LoadProbe` keeps its clients between observations; each observation is bounded by ``timeout_s`` and
raises :class:`ProbeError` naming what failed, after which the clients are made anew on the next call.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata
from pydantic import ValidationError

from schemas.events import ENGINE_WORKER_KIND, ServiceAnnouncement
from streams.kafka import clients
from streams.kafka.connection import Connectable
from streams.ops.scaling import Load

ENGINE_WORKER = ENGINE_WORKER_KIND  # the kind engine workers announce themselves as (schemas.events)


class ProbeError(RuntimeError):
    """Kafka did not answer an observation (in time); the message says what was asked."""


@dataclass(frozen=True)
class Observation:
    load: Load
    lag_by_partition: dict[int, int]
    workers: dict[str, ServiceAnnouncement]  # live engine workers by service id
    announced: bool  # whether any engine worker announced itself on the services topic


@dataclass
class LoadProbe:
    kafka: Connectable  # the settings (with their security options) or a plain address
    group_id: str
    topic: str
    services_topic: str
    stale_after_s: float = 15.0  # an announcement older than this is a worker that died without saying so
    timeout_s: float = 10.0
    _admin: AIOKafkaAdminClient | None = None
    _consumer: AIOKafkaConsumer | None = None
    _services: AIOKafkaConsumer | None = None
    _newest: dict[str, ServiceAnnouncement] = field(default_factory=dict)

    @property
    def bootstrap_servers(self) -> str:
        return self.kafka if isinstance(self.kafka, str) else self.kafka.bootstrap_servers

    async def observe(self) -> Observation:
        try:
            return await asyncio.wait_for(self._observe(), self.timeout_s)
        except (KafkaError, OSError, asyncio.TimeoutError) as error:
            await self.close()
            what = f"no answer within {self.timeout_s:g} s" if isinstance(error, asyncio.TimeoutError) else \
                (str(error.args[0]) if error.args else type(error).__name__)
            raise ProbeError(f"cannot read the lag of group {self.group_id} on {self.topic} from "
                             f"{self.bootstrap_servers}: {what}") from error

    async def close(self) -> None:
        for client in (self._services, self._consumer):
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.stop()
        if self._admin is not None:
            with contextlib.suppress(Exception):
                await self._admin.close()
        self._admin = self._consumer = self._services = None

    async def _observe(self) -> Observation:
        admin, consumer = await self._clients()
        partitions = consumer.partitions_for_topic(self.topic)
        if not partitions:
            await consumer._client.force_metadata_update()  # noqa: SLF001 - aiokafka has no public refresh
            partitions = consumer.partitions_for_topic(self.topic)
        if not partitions:
            raise ProbeError(f"topic {self.topic} does not exist on {self.bootstrap_servers}")
        tps = [TopicPartition(self.topic, p) for p in sorted(partitions)]
        ends = await consumer.end_offsets(tps)
        starts = await consumer.beginning_offsets(tps)
        committed = {tp.partition: meta.offset for tp, meta in (await self._group_offsets(admin)).items()
                     if tp.topic == self.topic and meta.offset >= 0}
        lag = {tp.partition: max(0, ends[tp] - committed.get(tp.partition, starts[tp])) for tp in tps}
        workers, announced = await self._live_workers()
        in_flight = sum(a.in_flight for a in workers.values())
        return Observation(Load(sum(lag.values()), in_flight, len(tps)), lag, workers, announced)

    async def _group_offsets(self, admin: AIOKafkaAdminClient) -> dict[TopicPartition, OffsetAndMetadata]:
        """The group's committed offsets; a coordinator not available yet is asked again for half the observation's
        time (clients.retrying)."""
        return await clients.retrying(lambda: admin.list_consumer_group_offsets(self.group_id),
                                       timeout_s=self.timeout_s / 2)

    async def _clients(self) -> tuple[AIOKafkaAdminClient, AIOKafkaConsumer]:
        if self._admin is None or self._consumer is None:
            self._admin = clients.make_admin(self.kafka, client_id="specstream-autoscale")
            await self._admin.start()
            self._consumer = clients.make_consumer(self.kafka, enable_auto_commit=False,
                                                    client_id="specstream-autoscale")
            await self._consumer.start()
        return self._admin, self._consumer

    async def _live_workers(self) -> tuple[dict[str, ServiceAnnouncement], bool]:
        """Read the services topic on from where the last observation stopped; keep each service's newest."""
        if self._services is None:
            assert self._consumer is not None
            if self.services_topic not in await self._consumer.topics():
                return {}, False
            self._services = clients.make_consumer(self.kafka, enable_auto_commit=False, auto_offset_reset="earliest",
                                                    client_id="specstream-autoscale")
            await self._services.start()
            self._services.assign([TopicPartition(self.services_topic, 0)])
        tp = TopicPartition(self.services_topic, 0)
        end = (await self._services.end_offsets([tp]))[tp]
        while await self._services.position(tp) < end:
            for record in (await self._services.getmany(tp, timeout_ms=500)).get(tp, []):
                self._file(record.key, record.value)
        now = time.time()
        live = {a.service_id: a for a in self._newest.values()
                if a.kind == ENGINE_WORKER and a.state in ("starting", "ready", "draining")
                and now - a.at <= self.stale_after_s}
        return live, any(a.kind == ENGINE_WORKER for a in self._newest.values())

    def _file(self, key: bytes | None, value: bytes | None) -> None:
        if value is None:  # a tombstone: the service is gone for good
            if key is not None:
                self._newest.pop(key.decode(errors="replace"), None)
            return
        with contextlib.suppress(ValidationError, ValueError):
            announcement = clients.decode(value, ServiceAnnouncement)
            name = f"{announcement.kind}/{announcement.service_id}"
            if name not in self._newest or announcement.at >= self._newest[name].at:
                self._newest[name] = announcement
