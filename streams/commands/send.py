"""``specstream send "prompt"``: one request straight onto the request topic, its reply stream printed as it arrives.

No edge is involved: the command owns a temporary reply topic (as an edge owns
its own), names it in the request's ``reply_to`` and deletes it afterwards.
"""
from __future__ import annotations

import argparse
import asyncio
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
    send.add_argument("--vector-store", action="append", default=[], metavar="ID",
                      help="ground the answer in this store's passages (the file_search tool; repeatable); "
                      "needs `specstream rag`")
    send.add_argument("--tenant", default="default", help="tenant the request is billed to (and whose stores it reads)")
    send.add_argument("--max-results", type=int, default=None, help="passages given to the model (--vector-store)")
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
        tenant=args.tenant,
    )


async def _send(args: argparse.Namespace, settings: Settings) -> int:
    from streams.kafka import clients

    # A reply topic of our own, as an edge would have; deleted afterwards.
    reply = settings.catalog.replies(f"cli-{uuid.uuid4().hex[:10]}")
    request = _request(args, settings, reply.name)
    topic, message = settings.catalog.requests.name, request
    if args.vector_store:  # through the retriever, which grounds it and hands it to the engine
        from schemas.retrieval import FileSearch, RetrievalRequest

        topic = settings.catalog.retrieval.name
        message = RetrievalRequest(request_id=request.request_id, reply_to=request.reply_to, op="chat",
                                   tenant=args.tenant, generate=request, search=FileSearch(
                                       vector_store_ids=args.vector_store,
                                       max_num_results=args.max_results or settings.rag.default_max_num_results))
    async with clients.reply_session(settings.kafka, reply, client_id="specstream-send") as (consumer, producer):
        await producer.send_and_wait(topic, clients.encode(message), key=clients.request_key(request.request_id))
        return await _print_replies(consumer, args)


async def _print_replies(consumer: Any, args: argparse.Namespace) -> int:
    """Print the reply stream until its Completion (0) or ErrorEvent (1), or give up after ``--timeout``."""
    from schemas.events import Completion, ErrorEvent
    from schemas.retrieval import Retrieved
    from streams.kafka import clients

    retrieved: Retrieved | None = None
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        batch = await consumer.getmany(timeout_ms=500)
        for records in batch.values():
            for record in records:
                event = clients.decode_reply(record.value)
                if args.json:
                    print(record.value.decode(), flush=True)
                if isinstance(event, Retrieved):
                    retrieved = event
                    continue
                if isinstance(event, Completion):
                    if not args.json:
                        _print_completion(event)
                        _print_citations(event.text, retrieved)
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


def _print_citations(text: str, retrieved: Any) -> None:
    """The passages a grounded answer was given, as the edge cites them (streams/rag/grounding.py)."""
    if retrieved is None:
        return
    from streams.rag.grounding import citations

    versions = ", ".join(f"{store} v{version}" for store, version in retrieved.index_versions.items())
    say(f"grounded on {len(retrieved.passages)} passage(s) ({versions or 'no index yet'}):")
    for number, cited in enumerate(citations(text, retrieved.passages), start=1):
        say(f"  [{number}] {cited['filename']} ({cited['file_id']}) chars {cited['char_start']}-{cited['char_end']}")
