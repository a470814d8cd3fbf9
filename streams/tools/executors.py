"""One validated call to its outcome: the calculator in the runner's process, python snippets in the sandbox.

The calculator needs no sandbox: it only walks an AST of numbers and operators with bounded sizes
(:mod:`streams.tools.calculator`). A python snippet is fed to ``python -I -S -`` on stdin inside the sandbox;
its stdout, stderr and exit status are its output, and a limit that stopped it is its error.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from schemas.tools import ToolError
from streams.config.tools import ToolSettings
from streams.tools.calculator import CalculatorError, evaluate
from streams.tools.sandbox import RunOutcome, Sandbox

_SIGXCPU, _SIGKILL = 24, 9
# The line a traceback ends with: ``BlockingIOError: [Errno 11] ...``, ``KeyboardInterrupt``, ``a.b.Error: x``.
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(: |(Error|Exception|Exit|Interrupt)$)")


@dataclass(frozen=True)
class ToolOutcome:
    output: Any = None
    error: ToolError | None = None
    truncated: bool = False


def calculate(arguments: dict[str, Any]) -> ToolOutcome:
    try:
        return ToolOutcome(output=evaluate(str(arguments.get("expression", ""))))
    except CalculatorError as error:
        return ToolOutcome(error=ToolError(code="invalid_expression", message=str(error)))


async def run_python(tool: ToolSettings, arguments: dict[str, Any], sandbox: Sandbox, python: str) -> ToolOutcome:
    run = await sandbox.run([python, "-I", "-S", "-"], str(arguments.get("code", "")).encode(), tool)
    return python_outcome(run, tool)


def python_outcome(run: RunOutcome, tool: ToolSettings) -> ToolOutcome:
    """stdout, stderr and exit status; the error names the limit that stopped the snippet, if one did."""
    output = {"stdout": run.stdout, "stderr": run.stderr, "exit_status": run.exit_status}
    return ToolOutcome(output=output, error=_limit_error(run, tool), truncated=run.truncated)


def _limit_error(run: RunOutcome, tool: ToolSettings) -> ToolError | None:
    status = run.exit_status
    if run.truncated:
        return ToolError(code="output_limit", message=f"printed more than {tool.max_output_bytes} bytes; stopped, "
                         "output truncated")
    if run.timed_out:
        return ToolError(code="timeout", message=f"still running after {tool.timeout_s:g} s (wall clock); killed")
    if status in (128 + _SIGXCPU, 128 + _SIGKILL):  # the CPU limit's soft and hard signals
        return ToolError(code="timeout", message=f"used more than {tool.cpu_s} s of CPU time; killed")
    last = exception_line(run.stderr)
    if status != 0 and last.startswith("MemoryError"):
        return ToolError(code="memory_limit", message=f"exceeded its {tool.memory_bytes} bytes of memory")
    if status != 0:
        return ToolError(code="nonzero_exit", message=f"exited with status {status}" + (f": {last}" if last else ""))
    return None


def exception_line(stderr: str) -> str:
    """The last line of stderr that names an exception, else its last line.

    A snippet that forks leaves several processes writing tracebacks to one stderr; when the sandbox ends them,
    the last line is often a child's unfinished ``Traceback (most recent call last):``, which names nothing.
    """
    lines = stderr.strip().splitlines()
    named = [line for line in lines if _EXCEPTION_LINE.match(line)]
    return (named or lines or [""])[-1]
