"""``specstream worker``, ``edge``, ``parser`` and ``rag``: one service in the foreground (``up`` starts them
as children)."""
from __future__ import annotations

import argparse
import asyncio
from typing import Any

from streams.commands.common import describe, say
from streams.commands.vllm_env import move_to_vllm_environment
from streams.config import Settings


def add_commands(commands: Any) -> None:
    commands.add_parser("worker", help="run one engine worker").set_defaults(handler=cmd_worker)
    commands.add_parser("edge", help="run the HTTP/websocket edge").set_defaults(handler=cmd_edge)
    commands.add_parser("parser", help="run one document parser (ingest jobs -> chunks)").set_defaults(
        handler=cmd_parser)
    commands.add_parser("rag", help="run the indexer and retriever (the process that opens the vector index)"
                        ).set_defaults(handler=cmd_rag)


def cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    from aiokafka.errors import KafkaError

    from engine.model_ref import check_model_ref

    def progress(line: str) -> None:
        say(f"engine: {line}")

    if settings.engine.backend == "vllm":
        move_to_vllm_environment(say)
    try:
        # Before the engine's import (torch: seconds), so a model that is not there fails at once.
        check_model_ref(settings.engine.model)
        from streams.worker import run_worker

        asyncio.run(run_worker(settings, progress=progress))
    except (KafkaError, OSError, ValueError) as error:
        say(f"worker: error: {describe(error)}")
        return 1
    return 0


def cmd_edge(args: argparse.Namespace, settings: Settings) -> int:
    from streams.edge.app import run_edge
    from streams.kafka.connection import KafkaAccessError

    try:
        run_edge(settings)
    except KafkaAccessError as error:
        say(f"edge: error: {describe(error)}")
        return 1
    return 0


def cmd_parser(args: argparse.Namespace, settings: Settings) -> int:
    from aiokafka.errors import KafkaError

    from streams.kafka.connection import KafkaAccessError
    from streams.rag.parser import run_parser

    try:
        run_parser(settings)
    except (KafkaError, KafkaAccessError, OSError, RuntimeError) as error:
        say(f"parser: error: {describe(error)}")
        return 1
    return 0


def cmd_rag(args: argparse.Namespace, settings: Settings) -> int:
    from aiokafka.errors import KafkaError

    from streams.rag.service import run_rag

    try:
        asyncio.run(run_rag(settings))
    except (KafkaError, OSError, ValueError, RuntimeError) as error:  # RuntimeError: the index folder is taken
        say(f"rag: error: {describe(error)}")
        return 1
    return 0
