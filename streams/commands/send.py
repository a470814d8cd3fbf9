"""``specstream send "prompt"``: one request straight onto the request topic, its reply stream printed as it arrives.

No edge is involved: the command owns a temporary reply topic (as an edge owns
its own), names it in the request's ``reply_to`` and deletes it afterwards.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
import uuid
from typing import Any

from streams.commands.common import describe, say
from streams.config import Settings


def add_commands(commands: Any) -> None:
    send = commands.add_parser("send", help="publish one request onto the request topic and stream the reply")
    send.add_argument("prompt")
    send.add_argument("--raw", action="store_true", help="send as a raw prompt (no chat template)")
    send.add_argument("--system", help="system message (chat)")
    send.add_argument("--model", help="model name (default: engine.model)")
    send.add_argument("--max-tokens", type=int, default=128)
    send.add_argument("--temperature", type=float, default=0.0)
    send.add_argument("--seed", type=int)
    send.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    send.add_argument("--no-speculation", action="store_true", help="disable speculative decoding for this request")
    send.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the completion")
    send.add_argument("--json", action="store_true", help="print every reply event as a JSON line")
    send.set_defaults(handler=cmd_send)


def cmd_send(args: argparse.Namespace, settings: Settings) -> int:
    from aiokafka.errors import KafkaError

    try:
        return asyncio.run(_send(args, settings))
    except KafkaError as error:
        say(f"send: error: {describe(error)}")
        return 1


def _request(args: argparse.Namespace, settings: Settings, reply_topic: str) -> Any:
    from schemas.events import ChatMessage, GenerateRequest, ReplyRoute, SamplingParams

    messages = None
    if not args.raw:
        messages = ([ChatMessage(role="system", content=args.system)] if args.system else []) + [
            ChatMessage(role="user", content=args.prompt)]
    return GenerateRequest(
        request_id=f"cli-{uuid.uuid4().hex[:12]}",
        prompt=args.prompt if args.raw else None,
        messages=messages,
        model=args.model or settings.engine.model,
        sampling=SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed,
                                stop=args.stop, speculation=False if args.no_speculation else None),
        reply_to=ReplyRoute(topic=reply_topic, partition=0),
        created_at=time.time(),
        deadline=time.time() + args.timeout,
    )


async def _send(args: argparse.Namespace, settings: Settings) -> int:
    from aiokafka import TopicPartition

    from streams import kafka_io

    kafka = settings.kafka
    # A reply topic of our own, as an edge would have; deleted afterwards.
    reply = settings.catalog.replies(f"cli-{uuid.uuid4().hex[:10]}")
    await kafka_io.ensure_topics(kafka, [reply], replication_factor=kafka.replication_factor,
                                 min_insync_replicas=kafka.min_insync_replicas)
    request = _request(args, settings, reply.name)
    consumer = kafka_io.make_consumer(kafka, enable_auto_commit=False, auto_offset_reset="earliest")
    producer = kafka_io.make_producer(kafka, client_id="specstream-send")
    await consumer.start()
    await producer.start()
    try:
        consumer.assign([TopicPartition(reply.name, 0)])
        await producer.send_and_wait(settings.catalog.requests.name, kafka_io.encode(request),
                                     key=kafka_io.request_key(request.request_id))
        return await _print_replies(consumer, args)
    finally:
        await consumer.stop()
        await producer.stop()
        with contextlib.suppress(Exception):
            await kafka_io.delete_topics(kafka, [reply.name])


async def _print_replies(consumer: Any, args: argparse.Namespace) -> int:
    """Print the reply stream until its Completion (0) or ErrorEvent (1), or give up after ``--timeout``."""
    from schemas.events import Completion, ErrorEvent
    from streams import kafka_io

    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        batch = await consumer.getmany(timeout_ms=500)
        for records in batch.values():
            for record in records:
                event = kafka_io.decode_reply(record.value)
                if args.json:
                    print(record.value.decode(), flush=True)
                if isinstance(event, Completion):
                    if not args.json:
                        _print_completion(event)
                    return 0
                if isinstance(event, ErrorEvent):
                    say(f"send: {event.code}: {event.message}")
                    return 1
                if not args.json:
                    sys.stdout.write(event.text)  # type: ignore[attr-defined]
                    sys.stdout.flush()
    say(f"send: no completion within {args.timeout:.0f}s (is a worker running? `specstream worker`)")
    return 1


def _print_completion(event: Any) -> None:
    usage, timings, spec = event.usage, event.timings, event.spec
    sys.stdout.write("\n")
    say(
        f"[{event.finish_reason}] {usage.prompt_tokens} prompt + {usage.completion_tokens} completion tokens; "
        f"queued {timings.queued_s * 1000:.0f} ms, first token {timings.ttft_s * 1000:.0f} ms, "
        f"total {timings.total_s:.2f} s; {event.num_chunks} chunks; speculation: {spec.accepted}/{spec.drafted} "
        f"accepted, {spec.tokens_per_forward:.2f} tokens/forward"
    )
