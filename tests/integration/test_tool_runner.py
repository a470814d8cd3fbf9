"""The tool runner on the real broker, executing in the real bubblewrap sandbox.

Arguments that fail the schema never reach the tool; a tenant without permission gets permission_denied;
every escape a snippet tries (endless loop, memory bomb, megabytes of output, fork bomb, a socket, a write
outside its /tmp, reading the keys file) is stopped or denied with a clear error result, and the runner keeps
serving; a runner killed with SIGKILL mid-call leaves its intent to be redelivered and answered once.
"""
from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from schemas.tools import ToolResult
from streams.kafka import clients
from streams.config import KafkaSettings, Settings
from streams.config.tools import SandboxSettings, ToolSettings, ToolsSettings
from streams.edge.keys import create_key
from streams.tools.client import ToolClient
from streams.tools.runner import ToolRunner
from streams.tools.sandbox import SandboxUnavailable
from tests.kafka_fixtures import kafka_bootstrap  # noqa: F401

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.kafka, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
FAST = {"timeout_s": 4.0, "cpu_s": 3, "memory_bytes": "128MiB", "max_output_bytes": "64KiB", "max_processes": 16}


def tool_settings(bootstrap: str, prefix: str, **sandbox: Any) -> Settings:
    registry = dict(ToolsSettings().registry)
    registry["python"] = ToolSettings(executor="python", parameters=registry["python"].parameters, **FAST)
    registry["alice_only"] = ToolSettings(executor="calculator", parameters=registry["calculator"].parameters,
                                          tenants=["alice"])
    return Settings(kafka=KafkaSettings(bootstrap_servers=bootstrap, topic_prefix=prefix),
                    tools=ToolsSettings(registry=registry, sandbox=SandboxSettings(**sandbox)))


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def settings(kafka_bootstrap: str) -> Settings:  # noqa: F811
    return tool_settings(kafka_bootstrap, f"t-tools-{uuid.uuid4().hex[:8]}")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def runner(settings: Settings) -> AsyncIterator[ToolRunner]:
    async with ToolRunner(settings) as running:
        yield running


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def client(settings: Settings, runner: ToolRunner) -> AsyncIterator[ToolClient]:
    async with ToolClient(settings) as tools:
        yield tools


Call = Callable[..., Awaitable[ToolResult]]


@pytest.fixture
def ran(runner: ToolRunner, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every command the runner's sandbox runs during the test."""
    commands: list[Any] = []
    original = runner.sandbox.run

    async def counting(*args: Any, **kwargs: Any) -> Any:
        commands.append(args)
        return await original(*args, **kwargs)

    monkeypatch.setattr(runner.sandbox, "run", counting)
    return commands


@pytest.fixture
def call(client: ToolClient) -> Call:
    async def run(tool: str, arguments: dict[str, Any], tenant: str = "default") -> ToolResult:
        return await client.call(client.intent(tool, arguments, tenant=tenant), timeout_s=60)
    return run


async def test_calculator_computes_and_refuses_what_is_not_arithmetic(call: Call) -> None:
    assert (await call("calculator", {"expression": "(2 + 3) * 7 ** 2 // 4"})).output == 61
    refused = await call("calculator", {"expression": "__import__('os').system('id')"})
    assert refused.error is not None and refused.error.code == "invalid_expression"
    assert "Call is not allowed" in refused.error.message
    huge = await call("calculator", {"expression": "9 ** 9 ** 9"})
    assert huge.error is not None and "exponent" in huge.error.message


async def test_schema_failing_arguments_never_reach_the_tool(call: Call, ran: list[Any]) -> None:
    wrong_type = await call("python", {"code": 42})
    assert wrong_type.error is not None and wrong_type.error.code == "rejected"
    assert "at code: 42 is not of type 'string'" in wrong_type.error.message
    extra = await call("python", {"code": "print(1)", "shell": "rm -rf /"})
    assert extra.error is not None and extra.error.code == "rejected" and "'shell' was unexpected" in extra.error.message
    assert ran == [] and wrong_type.output is None
    assert (await call("python", {"code": "print(1)"})).output["stdout"] == "1\n" and len(ran) == 1


async def test_a_tenant_without_permission_gets_permission_denied(call: Call) -> None:
    denied = await call("alice_only", {"expression": "1+1"}, tenant="bob")
    assert denied.error is not None and denied.error.code == "permission_denied"
    assert denied.error.message == "tenant 'bob' may not call 'alice_only'"
    assert (await call("alice_only", {"expression": "1+1"}, tenant="alice")).output == 2
    unknown = await call("shell", {"command": "id"})
    assert unknown.error is not None and unknown.error.code == "unknown_tool" and "registered:" in unknown.error.message


ESCAPES = {
    "endless loop": ("while True: pass", "timeout", None),
    "sleeping past the wall clock": ("import time\ntime.sleep(60)", "timeout", None),
    "memory bomb": ("x = bytearray(1 << 30)", "memory_limit", None),
    "megabytes of output": ("import sys\nwhile True: sys.stdout.write('x' * 65536)", "output_limit", None),
    "fork bomb": ("import os\nwhile True: os.fork()", "nonzero_exit", "BlockingIOError"),
    "a socket": ("import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=2)", "nonzero_exit",
                 "PermissionError"),
    "a write outside its /tmp": ("open('/usr/lib/escaped', 'w').write('x')", "nonzero_exit", "Read-only file system"),
}


@pytest.mark.parametrize("escape", list(ESCAPES))
async def test_each_escape_is_stopped_with_a_clear_error_and_the_runner_keeps_serving(call: Call, escape: str) -> None:
    code, error_code, in_message = ESCAPES[escape]
    result = await call("python", {"code": code})
    assert result.error is not None and result.error.code == error_code, result
    if in_message is not None:
        assert in_message in result.error.message
    if error_code == "output_limit":
        assert result.truncated and len(result.output["stdout"]) == 64 * 1024
    assert (await call("python", {"code": "print('still serving')"})).output["stdout"] == "still serving\n"


async def test_the_keys_file_and_the_project_are_not_in_the_sandbox(call: Call, tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.json"
    create_key(keys_file, "secret-tenant")
    home_keys = Path.home() / ".config" / "specstream" / "keys.json"
    paths = [str(keys_file), str(home_keys), str(REPO / "pyproject.toml"), "/etc/passwd", "/proc/1/environ"]
    code = f"import os\nfor p in {paths!r}:\n    print(p, os.path.exists(p))\nprint(open({str(keys_file)!r}).read())"
    result = await call("python", {"code": code})
    assert result.error is not None and result.error.code == "nonzero_exit"
    assert "FileNotFoundError" in result.error.message and "secret-tenant" not in result.output["stdout"]
    lines = result.output["stdout"].splitlines()
    assert lines[:4] == [f"{p} False" for p in paths[:4]]


async def test_a_writable_tmp_is_private_to_the_call(call: Call) -> None:
    first = await call("python", {"code": "open('/tmp/mine', 'w').write('x'); print(open('/tmp/mine').read())"})
    assert first.error is None and first.output == {"stdout": "x\n", "stderr": "", "exit_status": 0}
    second = await call("python", {"code": "import os; print(os.listdir('/tmp'))"})
    assert second.output["stdout"] == "[]\n"


async def test_an_intent_read_after_its_deadline_is_not_run(client: ToolClient) -> None:
    intent = client.intent("calculator", {"expression": "1"}).model_copy(update={"deadline": 1.0})
    result = await client.call(intent, timeout_s=60)
    assert result.error is not None and result.error.code == "deadline_exceeded"


async def test_a_runner_refuses_to_start_without_a_working_sandbox(kafka_bootstrap: str) -> None:  # noqa: F811
    broken = tool_settings(kafka_bootstrap, f"t-tools-{uuid.uuid4().hex[:8]}", bwrap="/nonexistent/bwrap")
    runner = ToolRunner(broken)
    with pytest.raises(SandboxUnavailable, match="/nonexistent/bwrap .*not found: install bubblewrap"):
        await runner.service.prepare()
    await runner.service.close()


async def test_specstream_tools_call_prints_the_result(settings: Settings, runner: ToolRunner) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "SPECSTREAM_KAFKA__BOOTSTRAP_SERVERS": settings.kafka.bootstrap_servers,
           "SPECSTREAM_KAFKA__TOPIC_PREFIX": settings.kafka.topic_prefix}
    ok = await _cli(env, "tools", "call", "calculator", '{"expression": "6*7"}')
    assert ok[0] == 0 and '"output": 42' in ok[1]
    refused = await _cli(env, "tools", "call", "python", '{"code": 1}')
    assert refused[0] == 1 and '"code": "rejected"' in refused[1]
    bad = await _cli(env, "tools", "call", "python", "{not json")
    assert bad[0] == 2 and "arguments are not JSON" in bad[2]
    listed = await _cli(env, "tools", "list")
    assert listed[0] == 0 and "calculator" in listed[1] and "python" in listed[1]


async def _cli(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(sys.executable, "-m", "streams.cli", *args, env=env, cwd=REPO,
                                                   stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), timeout=120)
    return process.returncode or 0, out.decode(), err.decode()


async def test_a_runner_killed_mid_call_leaves_one_result(kafka_bootstrap: str, tmp_path: Path) -> None:  # noqa: F811
    prefix = f"t-tools-kill-{uuid.uuid4().hex[:8]}"
    settings = tool_settings(kafka_bootstrap, prefix)
    env = {**os.environ, "PYTHONPATH": str(REPO), "SPECSTREAM_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap,
           "SPECSTREAM_KAFKA__TOPIC_PREFIX": prefix, "SPECSTREAM_TOOLS__RUNNER__SESSION_TIMEOUT_MS": "6000",
           # The killed runner's call becomes PID 1's to collect; where PID 1 does not reap (a container without
           # an init, as CI's), it stays a zombie counted against its uid's process limit for good: keep that uid
           # out of the range every other test's calls run under.
           "SPECSTREAM_TOOLS__SANDBOX__UID_BASE": str(SandboxSettings().uid_base + 2000)}
    first_log = tmp_path / "first.log"
    async with ToolClient(settings) as client:
        first = await _start_runner(env, first_log)
        intent = client.intent("python", {"code": "import time\ntime.sleep(2)\nprint('done')"})
        waiting = await client.publish(intent)
        await _wait_for_line(first_log, f"running call {intent.call_id}", first)
        first.send_signal(signal.SIGKILL)
        await first.wait()
        second = await _start_runner(env, tmp_path / "second.log")
        try:
            result = await asyncio.wait_for(waiting, timeout=120)
            assert result.output["stdout"] == "done\n" and result.error is None
            await asyncio.sleep(3)  # room for a second result, if one were coming
        finally:
            second.send_signal(signal.SIGTERM)
            await asyncio.wait_for(second.wait(), timeout=60)
    records = await clients.read_partition(kafka_bootstrap, settings.catalog.tool_results.name)
    answers = [r for r in records if clients.decode(r.value, ToolResult).call_id == intent.call_id]
    assert len(answers) == 1


async def _start_runner(env: dict[str, str], log: Path) -> asyncio.subprocess.Process:
    with log.open("wb") as handle:
        return await asyncio.create_subprocess_exec(sys.executable, "-m", "streams.cli", "tool-runner", env=env,
                                                    cwd=REPO, stdout=handle, stderr=asyncio.subprocess.STDOUT)


async def _wait_for_line(log: Path, text: str, process: asyncio.subprocess.Process, timeout_s: float = 90.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        if text in log.read_text(errors="replace"):
            return
        assert process.returncode is None, log.read_text(errors="replace")
        await asyncio.sleep(0.1)
    raise AssertionError(f"{text!r} not in the runner's log:\n{log.read_text(errors='replace')}")


async def test_a_call_asked_again_gets_its_result_again_without_running_twice(client: ToolClient,
                                                                            ran: list[Any]) -> None:
    intent = client.intent("python", {"code": "import random; print(random.random())"})
    first = await client.call(intent, timeout_s=60)
    again = await client.call(intent, timeout_s=60)  # e.g. a regenerated request's worker asking again
    assert again.output == first.output and len(ran) == 1
    other_tenant = await client.call(intent.model_copy(update={"tenant": "mallory"}), timeout_s=60)
    assert other_tenant.output != first.output and len(ran) == 2
