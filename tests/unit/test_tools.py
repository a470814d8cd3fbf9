"""Server-side tools without a broker: the calculator's bounds, the registry's validation, the checks of an
intent, call ids the edge and the worker agree on, and how the edge treats a result in the stream."""
from __future__ import annotations

import pytest

from schemas.events import Completion, SpecStats, Timings, TokenChunk, Usage
from schemas.tools import ToolIntent, ToolResult, call_id
from streams.config import ConfigError, Settings, load_settings
from streams.config.tools import ToolsSettings
from streams.edge.dedupe import Forwarded
from streams.wire.tool_calls import finish_reason, parse_message
from streams.tools.calculator import CalculatorError, evaluate
from streams.tools.checks import refusal
from streams.tools.executors import exception_line
from streams.tools.sandbox.seccomp import filter_bytes

CALL = '<tool_call>\n{"name": "python", "arguments": {"code": "print(1)"}}\n</tool_call>'


@pytest.mark.parametrize(("expression", "value"), [("1 + 2 * 3", 7), ("(1 + 2) * 3", 9), ("7 // 2", 3), ("7 % 4", 3),
                                                   ("2 ** 10", 1024), ("-3 + +1", -2), ("1 / 4", 0.25)])
def test_the_calculator_does_arithmetic(expression: str, value: float) -> None:
    assert evaluate(expression) == value


@pytest.mark.parametrize(("expression", "message"), [
    ("__import__('os').system('id')", "Call is not allowed"),
    ("x + 1", "Name is not allowed"),
    ("(1).real", "Attribute is not allowed"),
    ("'a' * 3", "Constant is not allowed"),
    ("9 ** 9 ** 9", "exponent"),
    ("2 ** 5000", "4096 bits"),
    ("10 ** 1000 * 10 ** 1000", "4096 bits"),
    ("1 / 0", "division by zero"),
    ("2.0 ** 9999", "too large"),
    ("(-8) ** 0.5", "not a real number"),
    ("1 +", "not an arithmetic expression"),
    ("1" * 1001, "the limit is 1000"),
    ("-" * 60 + "1", "nested deeper"),
    ("(" * 300 + "1" + ")" * 300, "not an arithmetic expression"),
])
def test_the_calculator_refuses_what_is_not_bounded_arithmetic(expression: str, message: str) -> None:
    with pytest.raises(CalculatorError, match=message):
        evaluate(expression)


def test_a_bad_registry_entry_fails_at_start_naming_the_key(tmp_path: pytest.TempPathFactory) -> None:
    config = tmp_path / "c.yaml"  # type: ignore[operator]
    config.write_text("tools:\n  registry:\n    python:\n      executor: python\n      parameters: {}\n      timeout: 3\n")
    with pytest.raises(ConfigError, match=r"tools\.registry\.python\.timeout: unknown key"):
        load_settings(config)
    config.write_text("tools:\n  registry:\n    bad:\n      executor: python\n      parameters: {type: 5}\n")
    with pytest.raises(ConfigError, match=r"tools\.registry\.bad\.parameters: not a valid JSON schema"):
        load_settings(config)
    config.write_text("tools:\n  registry:\n    'a b':\n      executor: calculator\n      parameters: {}\n")
    with pytest.raises(ConfigError, match=r"tools\.registry: tool name 'a b' must be"):
        load_settings(config)


def intent(tool: str, arguments: dict[str, object], tenant: str = "default") -> ToolIntent:
    return ToolIntent(request_id="r", call_id="c", tool=tool, arguments=arguments, tenant=tenant)


def test_an_intent_is_checked_against_the_allowlist_the_tenants_and_the_schema() -> None:
    registry = dict(ToolsSettings().registry)
    registry["private"] = registry["calculator"].model_copy(update={"tenants": ["alice"]})
    assert refusal(intent("calculator", {"expression": "1"}), registry) is None
    unknown = refusal(intent("rm", {}), registry)
    assert unknown is not None and unknown.code == "unknown_tool"
    denied = refusal(intent("private", {"expression": "1"}, tenant="bob"), registry)
    assert denied is not None and denied.code == "permission_denied"
    rejected = refusal(intent("calculator", {"expression": 1}), registry)
    assert rejected is not None and rejected.code == "rejected" and "at expression: 1 is not of type 'string'" in \
        rejected.message


def test_the_edge_names_a_call_as_the_worker_does() -> None:
    _, calls = parse_message(CALL + "\n" + CALL, "req-1")
    assert [c["id"] for c in calls] == [call_id("req-1", 0), call_id("req-1", 1)]
    assert call_id("req-1", 0) != call_id("req-2", 0) and call_id("req-1", 0).startswith("call_")


def test_calls_the_server_answered_do_not_end_the_answer_with_tool_calls() -> None:
    _, calls = parse_message(CALL + "The answer is 1.", "r")
    assert finish_reason("stop", calls, {calls[0]["id"]}) == "stop"
    assert finish_reason("stop", calls, set()) == "tool_calls"


def result_chunk(index: int, call: str) -> TokenChunk:
    result = ToolResult(request_id="r", call_id=call, tool="python", output={"stdout": "1\n"}, duration_s=0.1)
    return TokenChunk(request_id="r", index=index, text="", token_ids=[], text_offset=5, token_offset=2,
                      tool_result=result)


def test_a_result_in_the_stream_is_forwarded_once_even_when_regenerated() -> None:
    forwarded = Forwarded("r")
    assert forwarded.chunk(TokenChunk(request_id="r", index=0, text="hello", token_ids=[1, 2], text_offset=0,
                                      token_offset=0)) is not None
    first = forwarded.chunk(result_chunk(1, "call_a"))
    assert first is not None and first.index == 1 and first.tool_result is not None
    assert forwarded.chunk(result_chunk(1, "call_a")) is None  # the redelivered copy
    final = Completion(request_id="r", text="hello", finish_reason="stop", num_chunks=2,
                       usage=Usage(prompt_tokens=1, completion_tokens=2, total_tokens=3),
                       timings=Timings(queued_s=0, ttft_s=0, total_s=0), spec=SpecStats())
    tail, completion = forwarded.completion(final)
    assert tail is None and completion.num_chunks == 2


def test_the_seccomp_filter_is_a_whole_number_of_bpf_instructions() -> None:
    program = filter_bytes()
    assert program is None or (len(program) % 8 == 0 and 0 < len(program) // 8 < 4096)


def test_the_tool_topics_are_in_the_catalog_with_the_configured_retention() -> None:
    catalog = Settings(tools=ToolsSettings(retention_h=48)).catalog
    assert catalog.tool_intents.name == "specstream.tool-intents" and catalog.tool_intents.key == "call_id"
    assert catalog.tool_results.retention_ms == 48 * 3_600_000
    assert {catalog.tool_intents.name, catalog.tool_results.name} <= {t.name for t in catalog.shared_topics()}


@pytest.mark.parametrize(("stderr", "line"), [
    ("Traceback (most recent call last):\n  File \"<stdin>\", line 2\nBlockingIOError: [Errno 11] again\n"
     "Traceback (most recent call last):\n", "BlockingIOError: [Errno 11] again"),
    ("Traceback (most recent call last):\n  ...\nKeyboardInterrupt\n", "KeyboardInterrupt"),
    ("Traceback (most recent call last):\n  ...\n__main__.Boom: went off\n", "__main__.Boom: went off"),
    ("warning: disk almost full\nsomething else\n", "warning: disk almost full"),
    ("just text\n", "just text"),
    ("", ""),
])
def test_a_failed_snippet_is_summarised_by_its_last_exception_line(stderr: str, line: str) -> None:
    assert exception_line(stderr) == line
