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
