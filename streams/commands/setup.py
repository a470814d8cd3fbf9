"""``specstream prepare`` and ``specstream config check|example|reference``: set-up before anything runs."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from streams.commands.common import EXIT_CONFIG, prefixed, print_and_succeed, say
from streams.commands.doc_tables import write_table
from streams.config import ConfigError, Settings, config_path, example_yaml, load_settings, reference_markdown


def add_commands(commands: Any) -> None:
    commands.add_parser("prepare", help="fetch the Kafka jars, convert the model, build our kernels once").set_defaults(
        handler=cmd_prepare)

    config = commands.add_parser("config", help="check the configuration")
    config_actions = config.add_subparsers(dest="config_action", required=True, metavar="ACTION")
    check = config_actions.add_parser("check", help="validate a configuration file (default: the one in use)")
    check.add_argument("file", nargs="?")
    check.add_argument("--show", action="store_true", help="print the effective configuration as YAML")
    check.set_defaults(handler=cmd_config_check)
    config_actions.add_parser("example", help="print a documented configuration with every default").set_defaults(
        handler=lambda args, settings: print_and_succeed(example_yaml(), end=""))
    reference = config_actions.add_parser("reference", help="print the configuration reference (markdown)")
    reference.add_argument("--write", metavar="FILE", type=Path,
                           help="replace the reference table in this markdown file instead (docs/configuration.md)")
    reference.set_defaults(handler=cmd_config_reference)


def cmd_config_reference(args: argparse.Namespace, settings: Settings) -> int:
    if args.write is None:
        return print_and_succeed(reference_markdown())
    return write_table(args.write, reference_markdown())


def cmd_prepare(args: argparse.Namespace, settings: Settings) -> int:
    """Everything slow that happens once per machine: the Kafka jars (Maven), the model conversion and our C++ kernels
    (engine/fused: a minute of g++ that every process starting later would otherwise wait for). The kernels build on a
    thread of their own while the jars download and the model converts."""
    kernels = _KernelBuild() if not settings.engine.device.startswith("cuda") else None  # CPU kernels
    if settings.kafka.managed_port is not None:
        from infra.kafka.jars import ensure_kafka_jars

        libs = ensure_kafka_jars(progress=lambda line: say(prefixed("kafka", line)))
        say(f"kafka: jars in {libs}")
    from engine.loader import resolve_model_dir

    try:
        folder = resolve_model_dir(settings.engine.model, progress=lambda line: say(f"model: {line}"))
    except FileNotFoundError as error:
        say(f"model: error: {error}")
        return 1
    say(f"model: {settings.engine.model} ready in {folder}")
    if kernels is not None:
        say(f"kernels: {kernels.result()}")
    return 0


class _KernelBuild:
    """engine/fused/decoder_step.cpp built (or found built) on a thread, started now."""

    def __init__(self) -> None:
        import threading

        from engine.fused.build import load_ops

        say("kernels: engine/fused/decoder_step.cpp (built once, ~1 min, beside the steps below) ...")
        self._line = ""

        def build() -> None:
            built = load_ops("decoder_step")
            self._line = built.why if built.library is not None else f"none ({built.why}): the eager path"

        self._thread = threading.Thread(target=build, name="kernel-build", daemon=True)
        self._thread.start()

    def result(self) -> str:
        self._thread.join()
        return self._line


def cmd_config_check(args: argparse.Namespace, settings: Settings) -> int:
    if args.file is not None:
        try:
            settings = load_settings(args.file)
        except ConfigError as error:
            say(f"config error: {error}")
            return EXIT_CONFIG
    source = config_path(args.file if args.file is not None else args.config)
    print(f"config ok: {source if source is not None else 'built-in defaults'}")
    if args.show:
        import yaml

        print(yaml.safe_dump(settings.model_dump(mode="json"), sort_keys=False), end="")
    return 0
