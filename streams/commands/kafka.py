"""``specstream kafka ...`` (handed to infra.kafka's own parser) and the local broker ``specstream up`` manages."""
from __future__ import annotations

import contextlib
import socket
from dataclasses import dataclass
from typing import Any

from streams.commands.common import EXIT_CONFIG, console, prefixed, say
from streams.config import ConfigError, Settings, load_settings


def add_commands(commands: Any) -> None:
    # Listed for --help only: streams.cli.main hands `kafka` to infra.kafka's parser before argparse runs.
    commands.add_parser("kafka", help="local Kafka: start|stop|status|wait|reset|jars (see infra.kafka); "
                        "acls --print|--apply|--revoke (streams.commands.kafka_acls)")


def delegate(config: str | None, rest: list[str]) -> int:
    """`specstream kafka ARGS`: infra.kafka's CLI, on the port of the configured local broker unless ARGS name one."""
    from infra.kafka.cli import main as kafka_main

    if rest[:1] == ["acls"]:
        from streams.commands.kafka_acls import main as acls_main

        return acls_main(config, rest[1:])
    if rest and rest[0] not in ("-h", "--help") and not {"--port", "--cluster", "--secure"} & set(rest):
        try:
            settings = load_settings(config)
        except ConfigError as error:
            say(f"config error: {error}")
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

    def stop_if_started_here(self) -> None:
        if self.started_here and self.spec is not None:
            from infra.kafka import broker

            broker.stop(self.spec)
            say("kafka: stopped")


def ensure_kafka(settings: Settings) -> KafkaHandle:
    """Start the managed local broker when configured and not running; otherwise just use bootstrap_servers."""
    kafka = settings.kafka
    port = kafka.managed_port
    if port is None:
        say(f"kafka: using {kafka.bootstrap_servers} (not managed here)")
        return KafkaHandle(kafka.bootstrap_servers, started_here=False)
    from infra.kafka import broker

    spec = broker.single_node(port=port)
    if not broker.status(spec).any_process and _port_open("127.0.0.1", port):
        say(f"kafka: something already listens on 127.0.0.1:{port}; using it")
        return KafkaHandle(kafka.bootstrap_servers, started_here=False)
    with console.status(f"kafka: starting the local broker on 127.0.0.1:{port} ...") as status:
        def progress(line: str) -> None:
            status.update(prefixed("kafka", line))
            if "downloaded" not in line:
                say(prefixed("kafka", line))

        result = broker.start(spec, progress=progress)
    if result.started:
        ready = f" in {result.ready.elapsed_s:.1f}s" if result.ready else ""
        say(f"kafka: started on {spec.bootstrap_servers}{ready} (state in {spec.state_dir})")
    else:
        say(f"kafka: already running on {spec.bootstrap_servers}")
    return KafkaHandle(kafka.bootstrap_servers, started_here=bool(result.started), spec=spec)
