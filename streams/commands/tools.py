"""``specstream tools call|list`` (the server-side tool registry, for operators and tests) and ``tool-runner``."""
from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from streams.commands.common import describe, say
from streams.config import Settings

EXIT_USAGE = 2


def add_commands(commands: Any) -> None:
    commands.add_parser("tool-runner", help="run one tool runner (executes tool intents in the sandbox)").set_defaults(
        handler=cmd_tool_runner)
    tools = commands.add_parser("tools", help="server-side tools: list the registry, call one through the bus")
    actions = tools.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("list", help="the registry: name, executor, tenants, limits").set_defaults(handler=cmd_list)
    call = actions.add_parser("call", help="publish one intent and print its result (exit 1 if it failed)")
    call.add_argument("name", help="registered tool, e.g. calculator, python, file_search")
    call.add_argument("arguments", help="its arguments as a JSON object, e.g. '{\"expression\": \"2**10\"}'")
    call.add_argument("--tenant", default="default", help="tenant the call is made for (default: default)")
    call.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the result")
    call.set_defaults(handler=cmd_call)


def cmd_list(args: argparse.Namespace, settings: Settings) -> int:
    registry = settings.tools.registry
    if not registry:
        say("tools: the registry is empty (tools.registry)")
        return 0
    print(f"{'name':<16} {'executor':<11} {'tenants':<20} {'timeout':>8} {'memory':>10} {'output':>9}")
    for name, tool in sorted(registry.items()):
        print(f"{name:<16} {tool.executor:<11} {','.join(tool.tenants):<20} {tool.timeout_s:>7g}s "
              f"{tool.memory_bytes // 2**20:>7}MiB {tool.max_output_bytes // 1024:>6}KiB")
    for name, tool in sorted(registry.items()):
        if tool.executor == "file_search":
            stores = ", ".join(tool.vector_store_ids) or "the stores each call names"
            print(f"{name}: searches {stores} (only the calling tenant's stores)")
    print(f"max_rounds: {settings.tools.max_rounds}")
    return 0


def cmd_call(args: argparse.Namespace, settings: Settings) -> int:
    from aiokafka.errors import KafkaError

    try:
        arguments = json.loads(args.arguments)
    except json.JSONDecodeError as error:
        say(f"tools call: arguments are not JSON: {error.msg} at column {error.colno}")
        return EXIT_USAGE
    if not isinstance(arguments, dict):
        say(f"tools call: arguments must be a JSON object, got {type(arguments).__name__}")
        return EXIT_USAGE
    try:
        result = asyncio.run(_call(settings, args.name, arguments, args.tenant, args.timeout))
    except TimeoutError:
        say(f"tools call: no result within {args.timeout:g} s (is a tool runner running? specstream tool-runner)")
        return 1
    except KafkaError as error:
        say(f"tools call: error: {describe(error)}")
        return 1
    print(result.model_dump_json(indent=2))
    return 1 if result.error is not None else 0


async def _call(settings: Settings, name: str, arguments: dict[str, Any], tenant: str, timeout_s: float) -> Any:
    from streams.tools.client import ToolClient

    async with ToolClient(settings) as client:
        return await client.call(client.intent(name, arguments, tenant=tenant, timeout_s=timeout_s),
                                 timeout_s=timeout_s)


def cmd_tool_runner(args: argparse.Namespace, settings: Settings) -> int:
    from aiokafka.errors import KafkaError

    from streams.tools.runner import run_tool_runner
    from streams.tools.sandbox import SandboxUnavailable

    try:
        asyncio.run(run_tool_runner(settings))
    except SandboxUnavailable as error:
        say(f"tool-runner: refusing to start: {error}")
        return 1
    except (KafkaError, OSError) as error:
        say(f"tool-runner: error: {describe(error)}")
        return 1
    return 0
