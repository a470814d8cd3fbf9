"""Prometheus file-based discovery of the services on the bus.

Every service announces itself on ``<prefix>.services`` with a ``metrics_url``; this turns the
live announcements into a ``file_sd_configs`` file, so Prometheus scrapes every worker whatever
port it took::

    python -m streams.telemetry.targets --out /etc/prometheus/specstream-targets.json [--every 30]

A service counts while its latest announcement is ``ready`` or ``draining`` and younger than
``--max-age`` seconds (three heartbeats by default). Each target is labelled ``pool``: ``stable`` for
the services of ``<prefix>.services``, ``candidate`` for those of a canary rollout's candidate pool
(``<prefix>-candidate.services``), which is what the rollout's Prometheus gates compare.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from schemas.events import ServiceAnnouncement
from schemas.topics import TopicCatalog
from streams.kafka import clients
from streams.kafka.announcements import read_announcements
from streams.ops.rollout_router import candidate_prefix
from streams.config import ConfigError, load_settings


def file_sd(announcements: list[ServiceAnnouncement], *, now: float, max_age_s: float,
            pool: str = "stable") -> list[dict[str, Any]]:
    """One file_sd entry per live service that serves metrics, newest announcement per service winning."""
    latest: dict[tuple[str, str], ServiceAnnouncement] = {}
    for announcement in announcements:
        key = (announcement.kind, announcement.service_id)
        if key not in latest or announcement.at >= latest[key].at:
            latest[key] = announcement
    entries = []
    for (kind, service_id), announcement in sorted(latest.items()):
        if announcement.state not in ("ready", "draining") or now - announcement.at > max_age_s:
            continue
        if not announcement.metrics_url:
            continue
        url = urlsplit(announcement.metrics_url)
        entries.append({"targets": [url.netloc], "labels": {
            "kind": kind, "service_id": service_id, "pool": pool, "__metrics_path__": url.path or "/metrics",
            "__scheme__": url.scheme or "http"}})
    return entries


def write_atomically(path: Path, entries: list[dict[str, Any]]) -> None:
    """Prometheus re-reads the file when it changes; a half-written file must never be what it reads."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as handle:
        json.dump(entries, handle, indent=1)
    os.replace(handle.name, path)


async def _run(args: argparse.Namespace) -> None:
    settings = load_settings(args.config)
    prefix = settings.kafka.topic_prefix
    pools = {"stable": settings.catalog.services.name,
             "candidate": TopicCatalog(candidate_prefix(prefix)).services.name}
    max_age_s = args.max_age if args.max_age is not None else 3 * settings.worker.heartbeat_s
    while True:
        existing = set(await clients.list_topics(settings.kafka))
        entries = []
        for pool, topic in pools.items():
            if topic in existing:  # no rollout ever started: no candidate services topic
                newest, _ = await read_announcements(settings.kafka, topic)
                entries += file_sd(list(newest.values()), now=time.time(), max_age_s=max_age_s, pool=pool)
        write_atomically(Path(args.out), entries)
        if args.every is None:
            return
        await asyncio.sleep(args.every)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m streams.telemetry.targets", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the file_sd JSON file to write")
    parser.add_argument("--config", default=None, help="specstream configuration file")
    parser.add_argument("--every", type=float, default=None, help="rewrite every N seconds (default: once)")
    parser.add_argument("--max-age", type=float, default=None, help="seconds an announcement stays live")
    args = parser.parse_args(argv)
    try:
        asyncio.run(_run(args))
    except ConfigError as error:
        print(f"config error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
