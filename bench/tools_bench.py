"""Server-side tools: the sandbox's start cost, and a tool call's round trip on the bus.

    python -m bench.tools_bench                          # 200 starts per row, 200 calls per tool
    python -m bench.tools_bench --starts 20 --calls 20   # a smoke run

Sandbox start cost: the same empty program started N times, one after another, as a plain subprocess, under
bare bubblewrap (the view and namespaces only), and through the tool runner's whole sandbox (prlimit, an
unprivileged uid, seccomp, bubblewrap, the output pipes): `/bin/true`, then `python3 -I -S -c pass`.

Round trip on the bus: a tool runner and a client in this process, on a topic prefix of their own on the
broker the configuration names (`--config`, SPECSTREAM_KAFKA__*); each call is timed from publishing its
ToolIntent to receiving its ToolResult: `calculator` (the bus alone, no sandbox) and a `python` snippet that
prints one line (the bus plus a sandbox start). Calls run one at a time.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable

from streams.config import Settings, load_settings
from streams.config.tools import ToolSettings
from streams.tools.sandbox import Sandbox
from streams.tools.sandbox.view import bwrap_argv


def _percentiles(samples_s: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples_s)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    return f"p50 {statistics.median(ms):8.2f} ms   p99 {p99:8.2f} ms   (n={len(ms)})"


def _time_process(argv: list[str], starts: int) -> list[float]:
    samples = []
    for _ in range(starts):
        started = time.perf_counter()
        subprocess.run(argv, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        samples.append(time.perf_counter() - started)
    return samples


async def _time_async(call: Callable[[], Awaitable[object]], count: int) -> list[float]:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - started)
    return samples


async def sandbox_start_cost(settings: Settings, starts: int) -> None:
    sandbox = Sandbox(settings.tools.sandbox, slots=1)
    await sandbox.check()
    limits = ToolSettings(executor="python", parameters={})
    bare = [*bwrap_argv(settings.tools.sandbox.bwrap, tmp_bytes=limits.tmp_bytes, seccomp_fd=None), "--"]
    python = settings.tools.sandbox.python
    print("sandbox start cost (one after another):")
    for label, program in (("/bin/true", ["/bin/true"]), ("python -c pass", [python, "-I", "-S", "-c", "pass"])):
        print(f"  {label:<15} plain subprocess   {_percentiles(_time_process(program, starts))}")
        print(f"  {label:<15} bare bubblewrap    {_percentiles(_time_process([*bare, *program], starts))}")
        full = await _time_async(lambda program=program: sandbox.run(program, b"", limits), starts)
        print(f"  {label:<15} full sandbox       {_percentiles(full)}")


async def bus_round_trip(settings: Settings, calls: int) -> None:
    from streams.tools.client import ToolClient
    from streams.tools.runner import ToolRunner

    prefix = f"{settings.kafka.topic_prefix}-bench-{uuid.uuid4().hex[:6]}"
    settings = settings.model_copy(update={"kafka": settings.kafka.model_copy(update={"topic_prefix": prefix})})
    print(f"tool round trip on the bus (intent published -> result received; topics {prefix}.tool-*):")
    async with ToolRunner(settings), ToolClient(settings) as client:
        for tool, arguments in (("calculator", {"expression": "6 * 7"}), ("python", {"code": "print(42)"})):
            async def one(tool: str = tool, arguments: dict[str, str] = arguments) -> None:
                result = await client.call(client.intent(tool, arguments), timeout_s=60)
                if result.error is not None:
                    raise RuntimeError(f"{tool} failed: {result.error.code}: {result.error.message}")
            await one()  # warm-up: the first call waits for the group's assignment
            print(f"  {tool:<11} {_percentiles(await _time_async(one, calls))}")
    from streams.kafka import clients

    catalog = settings.catalog
    await clients.delete_topics(settings.kafka, [catalog.tool_intents.name, catalog.tool_results.name])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="configuration file (the broker, the sandbox settings)")
    parser.add_argument("--starts", type=int, default=200, help="process starts per row of the start cost")
    parser.add_argument("--calls", type=int, default=200, help="calls per tool of the round trip")
    parser.add_argument("--no-bus", action="store_true", help="only the sandbox start cost (no broker needed)")
    args = parser.parse_args(argv)
    settings = load_settings(args.config)
    asyncio.run(sandbox_start_cost(settings, args.starts))
    if not args.no_bus:
        asyncio.run(bus_round_trip(settings, args.calls))


if __name__ == "__main__":
    main()
