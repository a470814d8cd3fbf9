"""What every command shares: plain lines on stderr, rich consoles, error wording, the config exit status."""
from __future__ import annotations

import sys

from rich.console import Console

# Progress and results go to stderr/stdout through rich; children inherit the terminal.
console = Console(stderr=True, highlight=False)
out = Console(highlight=False)

EXIT_CONFIG = 2


def say(message: str) -> None:
    """One plain line on stderr: never wrapped or styled, so it can be grepped and read in CI logs."""
    print(message, file=sys.stderr, flush=True)


def prefixed(who: str, line: str) -> str:
    line = line.strip()
    return line if line.startswith(f"{who}:") else f"{who}: {line}"


def describe(error: BaseException) -> str:
    """The message alone: aiokafka's errors print their class name before it (and sometimes twice)."""
    from aiokafka.errors import KafkaError

    if isinstance(error, KafkaError) and error.args:
        return str(error.args[0])
    return str(error)


def print_and_succeed(text: str, end: str = "\n") -> int:
    print(text, end=end)
    return 0


def format_duration(seconds: float) -> str:
    """``42s``, ``5m02s``, ``3h04m``, ``2d03h``: short enough for a table column."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"
