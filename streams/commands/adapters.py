"""``specstream adapters load|unload|list``: the LoRA adapter registry on the bus (what the edge's
POST /v1/load_lora_adapter and /v1/unload_lora_adapter write too).

    specstream adapters load sql-expert /models/adapters/sql --wait 30s
    specstream adapters unload sql-expert
    specstream adapters list [--json]

``load`` and ``unload`` publish to the compacted adapters topic and wait (``--wait``, 0: do not) until the live
engine workers' announcements show the result: exit 0 when applied, 1 when a worker reported the load failed (its
reason printed) or nobody answered in time, 2 on bad input.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
import uuid
from typing import Any

from schemas.adapters import ADAPTER_NAME_PATTERN, AdapterCommand
from schemas.events import ENGINE_WORKER_KIND, ServiceAnnouncement
from streams.commands.common import say
from streams.commands.rollout import duration_s
from streams.config import Settings

EXIT_BAD_INPUT = 2
_LIVE_S = 30.0  # an announcement older than this is a worker that is gone


def add_commands(commands: Any) -> None:
    p = commands.add_parser("adapters", help="LoRA adapters served by the engine workers: load, unload, list")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    load = actions.add_parser("load", help="serve a PEFT LoRA adapter folder under a model name of its own")
    load.add_argument("name", help="the served model name of the adapter")
    load.add_argument("path", help="the adapter folder (adapter_config.json + adapter_model.safetensors) on the workers")
    unload = actions.add_parser("unload", help="stop serving an adapter (requests in flight finish)")
    unload.add_argument("name")
    for action in (load, unload):
        action.add_argument("--wait", default="30s", help="how long to wait for the workers to apply it (0: not)")
    listing = actions.add_parser("list", help="the adapters on the topic and which workers hold them")
    listing.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_adapters)


def cmd_adapters(args: argparse.Namespace, settings: Settings) -> int:
    if args.action == "list":
        return _list(args, settings)
    if not re.match(ADAPTER_NAME_PATTERN, args.name) or args.name == settings.engine.model:
        say(f"adapter name {args.name!r} must match {ADAPTER_NAME_PATTERN} and differ from the base model's")
        return EXIT_BAD_INPUT
    try:
        wait_s = duration_s(args.wait, "--wait")
    except ValueError as error:
        say(str(error))
        return EXIT_BAD_INPUT
    command = AdapterCommand(command_id=uuid.uuid4().hex, action=args.action, lora_name=args.name,
                             lora_path=getattr(args, "path", None), base_model=settings.engine.model, at=time.time())
    return asyncio.run(_apply(settings, command, wait_s))


async def _apply(settings: Settings, command: AdapterCommand, wait_s: float) -> int:
    from streams.kafka import clients

    catalog = settings.catalog
    await clients.ensure_topics(settings.kafka, [catalog.adapters])
    producer = clients.make_producer(settings.kafka, client_id="specstream-adapters")
    await producer.start()
    try:
        await producer.send_and_wait(catalog.adapters.name, clients.encode(command), key=command.lora_name.encode())
    finally:
        await producer.stop()
    say(f"{command.action} {command.lora_name} published to {catalog.adapters.name}")
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        workers = await _live_workers(settings)
        failed = [f"{w.service_id}: {w.adapter_errors[command.command_id]}" for w in workers
                  if command.command_id in w.adapter_errors]
        if failed:
            say(f"loading {command.lora_name} failed on " + "; ".join(failed))
            return 1
        holding = [w for w in workers if command.lora_name in w.adapters]
        done = (holding and all(w.at > command.at for w in holding)) if command.action == "load" else not holding
        if workers and done:
            say(f"{command.lora_name} {command.action}ed on {len(workers)} worker(s)")
            return 0
        await asyncio.sleep(0.5)
    if wait_s > 0:
        say(f"no answer from the workers within {wait_s:g} s; the command stays on the topic")
        return 1
    return 0


async def _live_workers(settings: Settings) -> list[ServiceAnnouncement]:
    from streams.kafka.announcements import read_announcements

    newest, _ = await read_announcements(settings.kafka, settings.catalog.services.name)
    now = time.time()
    return [a for a in newest.values()
            if a.kind == ENGINE_WORKER_KIND and a.state == "ready" and now - a.at <= _LIVE_S]


async def _registry(settings: Settings) -> dict[str, AdapterCommand]:
    from streams.kafka import clients

    newest: dict[str, AdapterCommand] = {}
    if settings.catalog.adapters.name not in await clients.list_topics(settings.kafka):
        return newest
    for record in await clients.read_partition(settings.kafka, settings.catalog.adapters.name):
        if record.value:
            command = clients.decode(record.value, AdapterCommand)
            newest[command.lora_name] = command
    return newest


def _list(args: argparse.Namespace, settings: Settings) -> int:
    async def gather() -> tuple[dict[str, AdapterCommand], list[ServiceAnnouncement]]:
        return await _registry(settings), await _live_workers(settings)

    registry, workers = asyncio.run(gather())
    names = sorted({*settings.engine.lora.adapters, *registry, *(n for w in workers for n in w.adapters)})
    rows = []
    for name in names:
        command = registry.get(name)
        path = command.lora_path if command is not None and command.action == "load" else \
            settings.engine.lora.adapters.get(name)
        rows.append({"name": name, "registry": command.action if command else "config", "path": path,
                     "workers": [w.service_id for w in workers if name in w.adapters]})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        say("no LoRA adapters")
    for row in rows:
        print(f"{row['name']}: {row['registry']}, {row['path'] or '-'}, held by {','.join(row['workers']) or 'none'}")
    return 0
