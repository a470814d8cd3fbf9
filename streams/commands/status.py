"""``specstream status [--all] [--json]``: every service on the bus, from its latest announcement.

Services (engine workers, edges, every consumer) announce themselves on the
compacted ``<prefix>.services`` topic (:class:`schemas.events.ServiceAnnouncement`,
keyed ``<kind>/<service_id>``): on start, every heartbeat, and on shutdown.
This command reads that topic from its start to the end offset it has when
asked, keeps each service's newest announcement (an empty value, a tombstone,
removes the service) and prints one row per service: kind, id, state,
host/pid, uptime, requests in flight, models and when it was last heard from.

A service whose newest announcement is older than ``--stale-after`` seconds
(default: the edge's readiness window, ``edge.ready_heartbeats`` x
``worker.heartbeat_s``) did not stop cleanly, or is stuck: it is shown as
``stale``. Stopped services are hidden unless ``--all``. Records that are not
readable announcements are skipped and counted on stderr.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

from schemas.events import ServiceAnnouncement
from streams.commands.common import describe, format_duration, say
from streams.config import Settings

COLUMNS = ("KIND", "ID", "STATE", "HOST/PID", "UPTIME", "IN FLIGHT", "MODELS", "LAST SEEN")


def add_commands(commands: Any) -> None:
    status = commands.add_parser("status", help="every service on the bus: kind, id, state, host/pid, uptime, load")
    status.add_argument("--all", action="store_true", help="show stopped services too")
    status.add_argument("--json", action="store_true", help="print a JSON array instead of the table")
    status.add_argument("--stale-after", type=float, metavar="SECONDS",
                        help="a service not heard from for this long is stale (default: the edge's readiness window)")
    status.set_defaults(handler=cmd_status)


@dataclass(frozen=True)
class ServiceStatus:
    """One service's newest announcement, seen at ``now``."""

    announcement: ServiceAnnouncement
    now: float
    stale_after_s: float

    @property
    def stopped(self) -> bool:
        return self.announcement.state == "stopped"

    @property
    def stale(self) -> bool:
        return not self.stopped and self.last_seen_s > self.stale_after_s

    @property
    def last_seen_s(self) -> float:
        return max(0.0, self.now - self.announcement.at)

    @property
    def uptime_s(self) -> float:
        """Since its start; for a stopped or stale service, how long it ran up to its last announcement."""
        a = self.announcement
        return max(0.0, (a.at if self.stopped or self.stale else self.now) - a.started_at)

    def row(self) -> tuple[str, ...]:
        a = self.announcement
        state = f"stale ({a.state})" if self.stale else a.state
        where = f"{a.host or '?'}/{a.pid if a.pid is not None else '?'}"
        return (a.kind, a.service_id, state, where, format_duration(self.uptime_s), str(a.in_flight),
                ",".join(a.models) or "-", f"{format_duration(self.last_seen_s)} ago")

    def as_dict(self) -> dict[str, Any]:
        return {**self.announcement.model_dump(mode="json"), "stale": self.stale,
                "uptime_s": round(self.uptime_s, 1), "last_seen_s": round(self.last_seen_s, 1)}


def table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(cell) for cell in column) for column in zip(COLUMNS, *rows)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in [COLUMNS, *rows])


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    from aiokafka.errors import KafkaError

    from streams.kafka import clients
    from streams.kafka.announcements import read_announcements

    servers, topic = settings.kafka.bootstrap_servers, settings.catalog.services.name
    try:
        if topic not in asyncio.run(clients.list_topics(settings.kafka)):
            say(f"status: no topic {topic} on {servers}: no service announced itself (is the stack up? `specstream up`)")
            return 1
        announcements, unreadable = asyncio.run(read_announcements(settings.kafka, topic))
    except (KafkaError, OSError) as error:
        say(f"status: error: {describe(error)}")
        return 1
    stale_after_s = args.stale_after if args.stale_after is not None else (
        settings.edge.ready_heartbeats * settings.worker.heartbeat_s)
    now = time.time()
    services = sorted((ServiceStatus(a, now, stale_after_s) for a in announcements.values()),
                      key=lambda s: (s.announcement.kind, s.announcement.service_id))
    shown = [s for s in services if args.all or not s.stopped]
    if args.json:
        print(json.dumps([s.as_dict() for s in shown], indent=2))
    elif shown:
        print(table([s.row() for s in shown]))
    hidden = len(services) - len(shown)
    say(f"{len(shown)} service(s) on {topic}" + (f"; {hidden} stopped not shown (--all shows them)" if hidden else ""))
    if unreadable:
        say(f"status: skipped {unreadable} record(s) of {topic} that are not service announcements")
    return 0
