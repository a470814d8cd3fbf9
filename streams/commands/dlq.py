"""``specstream dlq list|redrive``: the dead-letter topic (:mod:`streams.kafka.dead_letter_topic`) from the command line."""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from streams.kafka.dead_letter_topic import read_letters, redrive


def add_dlq_commands(commands: Any) -> None:
    """Register ``specstream dlq list|redrive`` on the CLI's subparsers."""
    dlq = commands.add_parser("dlq", help="the dead-letter topic: list and re-drive rejected messages")
    actions = dlq.add_subparsers(dest="dlq_action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="the newest dead letters, oldest first")
    listing.add_argument("--limit", type=int, default=20, help="how many of the newest letters (default 20)")
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    listing.set_defaults(handler=cmd_dlq)
    again = actions.add_parser("redrive", help="publish dead letters' original bytes to their source topic again")
    which = again.add_mutually_exclusive_group(required=True)
    which.add_argument("--offset", type=int, action="append", help="dead-letter offset (repeatable)")
    which.add_argument("--all", action="store_true", help="every dead letter in the topic")
    again.add_argument("--to", metavar="TOPIC", help="publish to this topic instead of each letter's source topic")
    again.set_defaults(handler=cmd_dlq)


def cmd_dlq(args: argparse.Namespace, settings: Any) -> int:
    from aiokafka.errors import KafkaError

    try:
        return asyncio.run(_dlq(args, settings))
    except (KafkaError, asyncio.TimeoutError, OSError) as error:
        print(f"dlq: error: {error or type(error).__name__}", file=sys.stderr)
        return 1


async def _dlq(args: argparse.Namespace, settings: Any) -> int:
    kafka = settings.kafka
    topic = settings.catalog.dead_letters.name
    if args.dlq_action == "list":
        letters = await read_letters(kafka, topic, limit=max(0, args.limit))
        for item in letters:
            if args.json:
                print(json.dumps(item.as_dict(), ensure_ascii=False))
            elif item.letter is None:
                print(f"{item.offset}  unreadable dead letter: {item.problem}")
            else:
                d = item.letter
                when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(d.at))
                print(f"{item.offset}  {when}  {d.source_topic}/{d.source_partition}@{d.source_offset}  "
                      f"{len(item.original)} bytes  by {d.consumer}: {d.reason}")
        if not args.json:
            print(f"{len(letters)} dead letter(s) shown from {topic}", file=sys.stderr)
        return 0
    letters = await read_letters(kafka, topic, offsets=None if args.all else args.offset)
    if not args.all:
        missing = sorted(set(args.offset) - {item.offset for item in letters})
        if missing:
            print(f"dlq: no dead letter at offset(s) {', '.join(map(str, missing))} of {topic}", file=sys.stderr)
            return 1
    written = await redrive(kafka, letters, to_topic=args.to, dead_letter_topic=topic)
    for item, out_topic, partition, offset in written:
        print(f"{item.offset} -> {out_topic}/{partition}@{offset}")
    print(f"re-drove {len(written)} dead letter(s)", file=sys.stderr)
    return 0
