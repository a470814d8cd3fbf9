"""The services topic read whole: each service's newest announcement (``specstream status``, the autoscaler's
targets, Prometheus' file_sd).

Services announce themselves on the compacted ``<prefix>.services`` topic keyed ``<kind>/<service_id>``; an empty
value (a tombstone) removes the service.
"""
from __future__ import annotations

from pydantic import ValidationError

from schemas.events import ServiceAnnouncement
from streams.kafka import clients
from streams.kafka.connection import Connectable


async def read_announcements(kafka: Connectable, topic: str,
                             timeout_s: float = 30.0) -> tuple[dict[str, ServiceAnnouncement], int]:
    """``<kind>/<service_id>`` -> newest announcement, and how many records were not readable announcements."""
    newest: dict[str, ServiceAnnouncement] = {}
    unreadable = 0
    for record in await clients.read_partition(kafka, topic, timeout_s=timeout_s):
        if record.value is None:  # a tombstone: the service is gone for good
            if record.key is not None:
                newest.pop(record.key.decode(errors="replace"), None)
            continue
        try:
            announcement = clients.decode(record.value, ServiceAnnouncement)
        except ValidationError:
            unreadable += 1
            continue
        key = f"{announcement.kind}/{announcement.service_id}"
        if key not in newest or announcement.at >= newest[key].at:
            newest[key] = announcement
    return newest, unreadable
