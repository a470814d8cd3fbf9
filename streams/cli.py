"""``specstream``: run and poke the pipeline.

    specstream up                      Kafka (if local and missing), topics, engine worker, edge; Ctrl-C stops them
    specstream worker                  one engine worker (a second one joins the same consumer group)
    specstream edge                    the HTTP/websocket edge
    specstream kafka start|stop|status the local broker (infra.kafka)
    specstream topics create|list|markdown|asyncapi|gc
    specstream dlq list|redrive         the dead-letter topic (streams.dlq)
    specstream send "prompt"           one request straight onto the request topic, streamed back
    specstream bench ...               load-test a running stack (streams.bench)
    specstream prepare                 fetch the Kafka jars and convert the model (what `up` would do first)
    specstream config check [FILE]
    specstream keys create --tenant NAME | list | revoke ID   the edge's API keys (streams.edge.keys_cli)

Every command reads one configuration (``--config FILE``, else $SPECSTREAM_CONFIG,
else ./specstream.yaml if present, else the defaults). A configuration error
prints one line and exits with status 2.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from streams.config import ConfigError, Settings, config_path, example_yaml, load_settings, reference_markdown

# Progress and results go to stderr/stdout through rich; children inherit the terminal.
console = Console(stderr=True, highlight=False)
out = Console(highlight=False)

EXIT_CONFIG = 2
READY_TIMEOUT_S = 900.0  # first start converts the model; later starts take seconds
STOP_TIMEOUT_S = 45.0


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
        _say(f"config error: {error}")
        return EXIT_CONFIG
    _configure_logging(settings.log_level)
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
        return _kafka(config, rest)
    from streams.bench.cli import main as bench_main

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

    up = commands.add_parser("up", help="start what is missing: Kafka, topics, engine worker, edge")
    up.add_argument("--no-edge", action="store_true", help="do not start an edge")
    up.add_argument("--no-worker", action="store_true", help="do not start an engine worker")
    up.set_defaults(handler=cmd_up)

    commands.add_parser("worker", help="run one engine worker").set_defaults(handler=cmd_worker)
    commands.add_parser("edge", help="run the HTTP/websocket edge").set_defaults(handler=cmd_edge)

    # Listed for --help only: main() hands these two to their own parsers before argparse runs.
    commands.add_parser("kafka", help="local Kafka: start|stop|status|wait|reset|jars (see infra.kafka)")

    commands.add_parser("bench", help="load-test a running stack (see streams.bench.cli)")

    topics = commands.add_parser("topics", help="the topic catalog")
    topics.add_argument("action", choices=["create", "list", "markdown", "asyncapi", "gc"])
    topics.add_argument("--idle-minutes", type=float, default=60.0,
                        help="gc: delete reply topics of edges neither announced nor replied to for this long")
    topics.add_argument("--dry-run", action="store_true", help="gc: only say what would be deleted")
    topics.set_defaults(handler=cmd_topics)

    from streams.dlq import add_dlq_commands

    add_dlq_commands(commands)

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

    commands.add_parser("prepare", help="fetch the Kafka jars and convert the model once").set_defaults(
        handler=cmd_prepare)

    config = commands.add_parser("config", help="check the configuration")
    config_actions = config.add_subparsers(dest="config_action", required=True, metavar="ACTION")
    check = config_actions.add_parser("check", help="validate a configuration file (default: the one in use)")
    check.add_argument("file", nargs="?")
    check.add_argument("--show", action="store_true", help="print the effective configuration as YAML")
    check.set_defaults(handler=cmd_config_check)
    config_actions.add_parser("example", help="print a documented configuration with every default").set_defaults(
        handler=lambda args, settings: _print_and_succeed(example_yaml(), end=""))
    config_actions.add_parser("reference", help="print the configuration reference (markdown)").set_defaults(
        handler=lambda args, settings: _print_and_succeed(reference_markdown()))

    from streams.edge.keys_cli import add_keys_commands

    add_keys_commands(commands)
    return parser


def _print_and_succeed(text: str, end: str = "\n") -> int:
    print(text, end=end)
    return 0


def _configure_logging(level: str) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    # Client libraries log every connection and rebalance step at INFO.
    quiet = logging.DEBUG if level == "DEBUG" else logging.WARNING
    for name in ("aiokafka", "specstream.worker.faststream", "httpx", "faststream"):
        logging.getLogger(name).setLevel(quiet)


def _describe(error: BaseException) -> str:
    """The message alone: aiokafka's errors print their class name before it (and sometimes twice)."""
    from aiokafka.errors import KafkaError

    if isinstance(error, KafkaError) and error.args:
        return str(error.args[0])
    return str(error)


def _prefixed(who: str, line: str) -> str:
    line = line.strip()
    return line if line.startswith(f"{who}:") else f"{who}: {line}"


def _say(message: str) -> None:
    """One plain line on stderr: never wrapped or styled, so it can be grepped and read in CI logs."""
    print(message, file=sys.stderr, flush=True)


# --- worker, edge ----------------------------------------------------------------------------------------------------


def cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    from streams.worker import run_worker

    def progress(line: str) -> None:
        _say(f"engine: {line}")

    try:
        asyncio.run(run_worker(settings, progress=progress))
    except _startup_errors() as error:
        _say(f"worker: error: {_describe(error)}")
        return 1
    return 0


def cmd_edge(args: argparse.Namespace, settings: Settings) -> int:
    from streams.edge.app import run_edge

    run_edge(settings)
    return 0


def _startup_errors() -> tuple[type[BaseException], ...]:
    from aiokafka.errors import KafkaError

    return (KafkaError, OSError, ValueError)


# --- kafka -----------------------------------------------------------------------------------------------------------


def _kafka(config: str | None, rest: list[str]) -> int:
    from infra.kafka.cli import main as kafka_main

    if rest and rest[0] not in ("-h", "--help") and "--port" not in rest and "--cluster" not in rest:
        try:
            settings = load_settings(config)
        except ConfigError as error:
            _say(f"config error: {error}")
            return EXIT_CONFIG
        port = settings.kafka.local_port or settings.kafka.local_bootstrap_port
        if port is not None:
            rest += ["--port", str(port)]
    return kafka_main(rest)


def _port_open(host: str, port: int, timeout_s: float = 0.5) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=timeout_s):
        return True
    return False


@dataclass
class KafkaHandle:
    bootstrap_servers: str
    started_here: bool
    spec: Any = None


def ensure_kafka(settings: Settings) -> KafkaHandle:
    """Start the managed local broker when configured and not running; otherwise just use bootstrap_servers."""
    kafka = settings.kafka
    port = kafka.managed_port
    if port is None:
        _say(f"kafka: using {kafka.bootstrap_servers} (not managed here)")
        return KafkaHandle(kafka.bootstrap_servers, started_here=False)
    from infra.kafka import broker

    spec = broker.single_node(port=port)
    if not broker.status(spec).any_process and _port_open("127.0.0.1", port):
        _say(f"kafka: something already listens on 127.0.0.1:{port}; using it")
        return KafkaHandle(kafka.bootstrap_servers, started_here=False)
    with console.status(f"kafka: starting the local broker on 127.0.0.1:{port} ...") as status:
        def progress(line: str) -> None:
            status.update(_prefixed("kafka", line))
            if "downloaded" not in line:
                _say(_prefixed("kafka", line))

        result = broker.start(spec, progress=progress)
    if result.started:
        ready = f" in {result.ready.elapsed_s:.1f}s" if result.ready else ""
        _say(f"kafka: started on {spec.bootstrap_servers}{ready} (state in {spec.state_dir})")
    else:
        _say(f"kafka: already running on {spec.bootstrap_servers}")
    return KafkaHandle(kafka.bootstrap_servers, started_here=bool(result.started), spec=spec)


# --- topics ----------------------------------------------------------------------------------------------------------


def create_topics(settings: Settings) -> list[Any]:
    from streams import kafka_io

    kafka = settings.kafka
    return asyncio.run(kafka_io.ensure_topics(
        kafka.bootstrap_servers, settings.catalog.shared_topics(),
        replication_factor=kafka.replication_factor, min_insync_replicas=kafka.min_insync_replicas,
    ))


def cmd_topics(args: argparse.Namespace, settings: Settings) -> int:
    if args.action == "markdown":
        print(settings.catalog.markdown())
        return 0
    if args.action == "asyncapi":
        from streams.asyncapi import document_yaml

        print(document_yaml(settings), end="")
        return 0
    from aiokafka.errors import KafkaError

    from streams import kafka_io

    try:
        if args.action == "gc":
            from streams.topics_gc import run_gc

            return run_gc(settings, idle_minutes=args.idle_minutes, dry_run=args.dry_run)
        if args.action == "create":
            for result in create_topics(settings):
                print(f"{result.name}: {'created' if result.created else 'exists'}")
        else:
            prefix = settings.kafka.topic_prefix + "."
            for name in asyncio.run(kafka_io.list_topics(settings.kafka.bootstrap_servers)):
                if name.startswith(prefix):
                    print(name)
    except KafkaError as error:
        _say(f"topics: error: {_describe(error)}")
        return 1
    return 0


# --- send ------------------------------------------------------------------------------------------------------------


def cmd_send(args: argparse.Namespace, settings: Settings) -> int:
    from aiokafka.errors import KafkaError

    try:
        return asyncio.run(_send(args, settings))
    except KafkaError as error:
        _say(f"send: error: {_describe(error)}")
        return 1


async def _send(args: argparse.Namespace, settings: Settings) -> int:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from schemas.events import ChatMessage, Completion, ErrorEvent, GenerateRequest, ReplyRoute, SamplingParams
    from streams import kafka_io

    kafka = settings.kafka
    catalog = settings.catalog
    # A reply topic of our own, as an edge would have; deleted afterwards.
    reply = catalog.replies(f"cli-{uuid.uuid4().hex[:10]}")
    await kafka_io.ensure_topics(kafka.bootstrap_servers, [reply], replication_factor=kafka.replication_factor,
                                 min_insync_replicas=kafka.min_insync_replicas)
    request_id = f"cli-{uuid.uuid4().hex[:12]}"
    messages = None
    if not args.raw:
        messages = ([ChatMessage(role="system", content=args.system)] if args.system else []) + [
            ChatMessage(role="user", content=args.prompt)]
    request = GenerateRequest(
        request_id=request_id,
        prompt=args.prompt if args.raw else None,
        messages=messages,
        model=args.model or settings.engine.model,
        sampling=SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed,
                                stop=args.stop, speculation=False if args.no_speculation else None),
        reply_to=ReplyRoute(topic=reply.name, partition=0),
        created_at=time.time(),
        deadline=time.time() + args.timeout,
    )
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap_servers, enable_auto_commit=False,
                                auto_offset_reset="earliest")
    producer = kafka_io.make_producer(kafka.bootstrap_servers, client_id="specstream-send")
    await consumer.start()
    await producer.start()
    try:
        consumer.assign([TopicPartition(reply.name, 0)])
        await producer.send_and_wait(catalog.requests.name, kafka_io.encode(request),
                                     key=kafka_io.request_key(request_id))
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
                        _say(f"send: {event.code}: {event.message}")
                        return 1
                    if not args.json:
                        sys.stdout.write(event.text)  # type: ignore[attr-defined]
                        sys.stdout.flush()
        _say(f"send: no completion within {args.timeout:.0f}s (is a worker running? `specstream worker`)")
        return 1
    finally:
        await consumer.stop()
        await producer.stop()
        with contextlib.suppress(Exception):
            await kafka_io.delete_topics(kafka.bootstrap_servers, [reply.name])


def _print_completion(event: Any) -> None:
    usage, timings, spec = event.usage, event.timings, event.spec
    sys.stdout.write("\n")
    _say(
        f"[{event.finish_reason}] {usage.prompt_tokens} prompt + {usage.completion_tokens} completion tokens; "
        f"queued {timings.queued_s * 1000:.0f} ms, first token {timings.ttft_s * 1000:.0f} ms, "
        f"total {timings.total_s:.2f} s; {event.num_chunks} chunks; speculation: {spec.accepted}/{spec.drafted} "
        f"accepted, {spec.tokens_per_forward:.2f} tokens/forward"
    )


# --- prepare, config -------------------------------------------------------------------------------------------------


def cmd_prepare(args: argparse.Namespace, settings: Settings) -> int:
    """Everything slow that happens once per machine: the Kafka jars (Maven) and the model conversion."""
    if settings.kafka.managed_port is not None:
        from infra.kafka.jars import ensure_kafka_jars

        libs = ensure_kafka_jars(progress=lambda line: _say(_prefixed("kafka", line)))
        _say(f"kafka: jars in {libs}")
    from engine.loader import resolve_model_dir

    try:
        folder = resolve_model_dir(settings.engine.model, progress=lambda line: _say(f"model: {line}"))
    except FileNotFoundError as error:
        _say(f"model: error: {error}")
        return 1
    _say(f"model: {settings.engine.model} ready in {folder}")
    return 0


def cmd_config_check(args: argparse.Namespace, settings: Settings) -> int:
    if args.file is not None:
        try:
            settings = load_settings(args.file)
        except ConfigError as error:
            _say(f"config error: {error}")
            return EXIT_CONFIG
    source = config_path(args.file if args.file is not None else args.config)
    print(f"config ok: {source if source is not None else 'built-in defaults'}")
    if args.show:
        import yaml

        print(yaml.safe_dump(settings.model_dump(mode="json"), sort_keys=False), end="")
    return 0


# --- up --------------------------------------------------------------------------------------------------------------


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]


def _spawn(name: str, args: argparse.Namespace, command: str) -> Child:
    argv = [sys.executable, "-m", "streams.cli"]
    if args.config:
        argv += ["--config", args.config]
    # Own process group: the terminal's Ctrl-C reaches only `up`, which then stops children in order.
    process = subprocess.Popen([*argv, command], start_new_session=True, stdin=subprocess.DEVNULL)
    _say(f"{name}: started (pid {process.pid})")
    return Child(name, process)


def _stop_children(children: list[Child]) -> None:
    """SIGTERM each child's process group in order and wait; SIGKILL after STOP_TIMEOUT_S or a second Ctrl-C."""
    deadline = time.monotonic() + STOP_TIMEOUT_S
    try:
        for child in children:
            if child.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.process.pid, signal.SIGTERM)
            try:
                child.process.wait(max(0.1, deadline - time.monotonic()))
                _say(f"{child.name}: stopped")
            except subprocess.TimeoutExpired:
                _kill(child, f"killed after {STOP_TIMEOUT_S:.0f}s")
    except KeyboardInterrupt:
        for child in children:
            if child.process.poll() is None:
                _kill(child, "killed (interrupted again)")


def _kill(child: Child, why: str) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.process.pid, signal.SIGKILL)
    child.process.wait()
    _say(f"{child.name}: {why}")


def _http_status(url: str) -> int | None:
    import httpx

    try:
        return httpx.get(url, timeout=2.0).status_code
    except httpx.HTTPError:
        return None


@contextlib.contextmanager
def _stop_signals_interrupt() -> Iterator[None]:
    """SIGINT (Ctrl-C) and SIGTERM both mean "stop everything cleanly".

    SIGINT is set explicitly because a process started in the background by a
    non-interactive shell inherits it ignored.
    """
    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def cmd_up(args: argparse.Namespace, settings: Settings) -> int:
    from aiokafka.errors import KafkaError

    from infra.kafka.errors import KafkaInfraError

    children: list[Child] = []
    kafka: KafkaHandle | None = None
    with _stop_signals_interrupt():
        try:
            kafka = ensure_kafka(settings)
            with console.status("topics: creating ..."):
                results = create_topics(settings)
            created = [r.name for r in results if r.created]
            _say(f"topics: {', '.join(created) + ' created' if created else 'all present'}")
            edge = settings.edge
            base = f"http://{edge.host}:{edge.port}"
            edge_running = _http_status(f"{base}/healthz") == 200
            from streams.edge.keys_cli import curl_auth, prepare_up

            key_file = None if args.no_edge else prepare_up(settings, _say)  # the local API key, or a loud warning
            if args.no_worker:
                _say("worker: not started (--no-worker)")
            else:
                children.append(_spawn("worker", args, "worker"))
            if args.no_edge:
                _say("edge: not started (--no-edge)")
            elif edge_running:
                _say(f"edge: already running on {base}")
            else:
                children.append(_spawn("edge", args, "edge"))
            if not args.no_edge:
                _wait_ready(base, children)
                _print_urls(settings, base, curl_auth(key_file))
            else:
                _say("running; Ctrl-C stops")
            while True:
                for child in children:
                    code = child.process.poll()
                    if code is not None:
                        _say(f"{child.name}: exited with status {code}; stopping the rest")
                        return 1
                time.sleep(0.5)
        except KeyboardInterrupt:
            _say("stopping ...")
            return 0
        except (KafkaInfraError, KafkaError, ConfigError, OSError, TimeoutError) as error:
            _say(f"up: error: {_describe(error)}")
            return 1
        finally:
            # Edge first (no new requests), then the worker (drains), then the broker we started.
            _stop_children(list(reversed(children)))
            if kafka is not None and kafka.started_here and kafka.spec is not None:
                from infra.kafka import broker

                broker.stop(kafka.spec)
                _say("kafka: stopped")


def _wait_ready(base: str, children: list[Child]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    with console.status("waiting for the engine worker to load the model and announce itself ..."):
        while time.monotonic() < deadline:
            if _http_status(f"{base}/readyz") == 200:
                return
            for child in children:
                if child.process.poll() is not None:
                    raise OSError(f"{child.name} exited with status {child.process.returncode} while starting")
            time.sleep(1.0)
    raise TimeoutError(f"{base}/readyz not ready after {READY_TIMEOUT_S:.0f}s")


def _print_urls(settings: Settings, base: str, auth: str = "") -> None:
    ws = base.replace("http://", "ws://", 1)
    model = settings.engine.model
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "What is Kafka?"}],
                       "max_tokens": 64, "stream": True})
    out.print("\n[bold green]specstream is up[/bold green]")
    out.print(f"""  edge HTTP        {base}   (/healthz, /readyz)
  chat page        {base}/
  websocket        {ws}/v1/ws
  OpenAI base URL  {base}/v1   (model: {model})

  curl -N {base}/v1/chat/completions {auth}-H 'content-type: application/json' \\
    -d '{body}'

Ctrl-C stops everything.
""", markup=False, soft_wrap=True)


def _entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    _entry()
