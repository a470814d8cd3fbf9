"""``specstream topics create|list|markdown|asyncapi|gc``: the topic catalog on the cluster."""
from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from streams.commands.common import describe, say
from streams.commands.doc_tables import write_table
from streams.config import Settings


def add_commands(commands: Any) -> None:
    topics = commands.add_parser("topics", help="the topic catalog")
    topics.add_argument("action", choices=["create", "list", "markdown", "asyncapi", "gc"])
    topics.add_argument("--idle-minutes", type=float, default=60.0,
                        help="gc: delete reply topics of edges neither announced nor replied to for this long")
    topics.add_argument("--dry-run", action="store_true", help="gc: only say what would be deleted")
    topics.add_argument("--write", metavar="FILE", type=Path,
                        help="markdown: replace the catalog table in this markdown file instead (docs/topics.md)")
    topics.set_defaults(handler=cmd_topics)


def create_topics(settings: Settings) -> list[Any]:
    from streams.kafka import clients

    kafka = settings.kafka
    return asyncio.run(clients.ensure_topics(
        kafka, settings.catalog.shared_topics(),
        replication_factor=kafka.replication_factor, min_insync_replicas=kafka.min_insync_replicas,
    ))


def cmd_topics(args: argparse.Namespace, settings: Settings) -> int:
    if args.action == "markdown":
        if args.write is not None:
            return write_table(args.write, settings.catalog.markdown())
        print(settings.catalog.markdown())
        return 0
    if args.action == "asyncapi":
        from streams.asyncapi import document_yaml

        print(document_yaml(settings), end="")
        return 0
    from aiokafka.errors import KafkaError

    from streams.kafka import clients

    try:
        if args.action == "gc":
            from streams.kafka.reply_topics_gc import run_gc

            return run_gc(settings, idle_minutes=args.idle_minutes, dry_run=args.dry_run)
        if args.action == "create":
            for result in create_topics(settings):
                print(f"{result.name}: {'created' if result.created else 'exists'}")
        else:
            prefix = settings.kafka.topic_prefix + "."
            for name in asyncio.run(clients.list_topics(settings.kafka)):
                if name.startswith(prefix):
                    print(name)
    except KafkaError as error:
        say(f"topics: error: {describe(error)}")
        return 1
    return 0
