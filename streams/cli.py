"""``specstream``: run and poke the pipeline.

    specstream up                      Kafka (if local and missing), topics, engine worker, edge; Ctrl-C stops them
    specstream worker                  one engine worker (a second one joins the same consumer group)
    specstream edge                    the HTTP/websocket edge
    specstream rag                     the indexer and retriever (the one process that opens the vector index)
    specstream docs add|status|search  documents in a vector store (streams.commands.docs)
    specstream index rebuild --store   rebuild a store's index as a new version, then swap (streams.rag.rebuild)
    specstream status                  every service on the bus: kind, id, state, host/pid, uptime, load
    specstream kafka start|stop|status the local broker (infra.kafka); --secure: SASL_SSL with ACLs
    specstream kafka acls --print|--apply  each service's least privileges (streams.commands.kafka_acls)
    specstream topics create|list|markdown|asyncapi|gc
    specstream dlq list|redrive         the dead-letter topic (streams.commands.dlq)
    specstream eval replay|run         compare a candidate with recorded completions; score eval samples (streams.eval)
    specstream draft train             train a draft head (EAGLE) from the completions log (streams.draft)
    specstream send "prompt"           one request straight onto the request topic, streamed back
    specstream tool-runner             one tool runner: executes server-side tool calls in the sandbox
    specstream tools list | call NAME 'JSON-ARGS' [--tenant T]   the tool registry; one call through the bus
    specstream bench ...               load-test a running stack (streams.bench)
    specstream prepare                 fetch the Kafka jars and convert the model (what `up` would do first)
    specstream config check [FILE]
    specstream keys create --tenant NAME | list | revoke ID   the edge's API keys (streams.commands.keys)

Every command reads one configuration (``--config FILE``, else $SPECSTREAM_CONFIG,
else ./specstream.yaml if present, else the defaults). A configuration error
prints one line and exits with status 2.

This module only builds the parser and dispatches; each command group lives in
its own module under :mod:`streams.commands`.
"""
from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable

from streams.commands import (
    adapters,
    autoscale,
    batch,
    docs,
    k8s,
    kafka,
    plan,
    rollout,
    run,
    send,
    setup,
    status,
    tools,
    topics,
    up,
)
from streams.commands.common import EXIT_CONFIG, say
from streams.config import ConfigError, Settings, load_settings


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    delegated = _delegated(argv)
    if delegated is not None:
        return delegated
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = load_settings(args.config)
    except ConfigError as error:
        say(f"config error: {error}")
        return EXIT_CONFIG
    _configure_logging(settings.log_level, settings.log_format)
    handler: Callable[[argparse.Namespace, Settings], int] = args.handler
    try:
        return handler(args, settings)
    except KeyboardInterrupt:
        return 130


def _delegated(argv: list[str]) -> int | None:
    """`kafka` and `bench` hand their arguments, --help included, to their own parsers."""
    config: str | None = None
    rest = list(argv)
    if rest[:1] == ["--config"] and len(rest) >= 2:
        config, rest = rest[1], rest[2:]
    elif rest[:1] and rest[0].startswith("--config="):
        config, rest = rest[0].split("=", 1)[1], rest[1:]
    if not rest or rest[0] not in ("kafka", "bench"):
        return None
    command, rest = rest[0], rest[1:]
    if command == "kafka":
        return kafka.delegate(config, rest)
    from streams.commands.bench import main as bench_main

    if config and "--config" not in rest and rest[:1] != ["compare"]:
        rest += ["--config", config]
    return bench_main(rest)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specstream", description="LLM generation as an event-driven pipeline on Apache Kafka.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Configuration: --config FILE, else $SPECSTREAM_CONFIG, else ./specstream.yaml, else defaults;"
               " SPECSTREAM_<SECTION>__<KEY> environment variables override the file.",
    )
    parser.add_argument("--config", metavar="FILE", help="YAML configuration file")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up.add_commands(commands)
    status.add_commands(commands)
    plan.add_commands(commands)
    autoscale.add_commands(commands)
    k8s.add_commands(commands)
    rollout.add_commands(commands)
    adapters.add_commands(commands)
    run.add_commands(commands)
    batch.add_commands(commands)
    kafka.add_commands(commands)
    # Listed for --help only: main() hands `bench` to streams.commands.bench before argparse runs.
    commands.add_parser("bench", help="load-test a running stack (see streams.commands.bench)")
    topics.add_commands(commands)

    from streams.commands.dlq import add_dlq_commands

    add_dlq_commands(commands)
    from streams.commands.eval import add_eval_commands

    add_eval_commands(commands)
    from streams.commands.draft import add_draft_commands

    add_draft_commands(commands)
    send.add_commands(commands)
    docs.add_commands(commands)
    setup.add_commands(commands)
    tools.add_commands(commands)

    from streams.commands.keys import add_keys_commands

    add_keys_commands(commands)
    return parser


def _configure_logging(level: str, log_format: str = "text") -> None:
    from streams.telemetry.logs import configure_logging

    configure_logging(level, log_format)
    # Client libraries log every connection and rebalance step at INFO.
    quiet = logging.DEBUG if level == "DEBUG" else logging.WARNING
    for name in ("aiokafka", "specstream.faststream", "httpx", "faststream"):
        logging.getLogger(name).setLevel(quiet)


def _entry() -> None:
    sys.exit(main())


if __name__ == "__mp_main__":
    # Imported as the main module of a spawned child (vLLM's engine core and its model worker): die with the parent,
    # so kill -9 of a worker takes its engine with it.
    from streams.commands.vllm_env import die_with_parent

    die_with_parent()

if __name__ == "__main__":
    _entry()
