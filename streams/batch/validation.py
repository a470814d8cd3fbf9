"""Validation of a batch input file (``purpose="batch"``) when it is uploaded, before anything is stored.

Each line is ``{"custom_id", "method": "POST", "url": "/v1/chat/completions" | "/v1/completions", "body"}``; the
body is parsed by the same typed body models (:mod:`streams.wire.bodies`) as an interactive request, so
a line is accepted exactly when the endpoint would accept its body. The served model and the context length are
not checked here: a line that fails at run time goes to the batch's error file, and the other lines complete.
Every problem names its line (1-based), so a client can fix the file in one go.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streams.config.batch import BatchSettings
from streams.wire import errors
from streams.wire.bodies import Body, ChatCompletionBody, CompletionBody
from streams.wire.parse import decode_json, parse_body

ENDPOINTS: dict[str, type[Body]] = {"/v1/chat/completions": ChatCompletionBody, "/v1/completions": CompletionBody}
_LINE_KEYS = frozenset({"custom_id", "method", "url", "body"})
# Problems listed in one error; a file with more names the first ones and how many there are.
_MAX_LISTED = 20


@dataclass(frozen=True)
class BatchLine:
    number: int  # 1-based line of the input file
    custom_id: str
    url: str
    body: Body


@dataclass(frozen=True)
class LineProblem:
    line: int  # 0: the file as a whole
    message: str
    param: str | None = None

    def __str__(self) -> str:
        if self.line == 0:
            return self.message
        where = f" ({self.param})" if self.param else ""
        return f"line {self.line}{where}: {self.message}"


class InvalidBatchFile(Exception):
    def __init__(self, problems: list[LineProblem], *, code: str = "invalid_batch_file") -> None:
        self.problems = problems
        self.code = code
        listed = "; ".join(str(p) for p in problems[:_MAX_LISTED])
        more = f" (and {len(problems) - _MAX_LISTED} more)" if len(problems) > _MAX_LISTED else ""
        whole = len(problems) == 1 and problems[0].line == 0
        super().__init__(f"The batch input file is refused: {listed}." if whole else
                         f"The batch input file has {len(problems)} invalid line(s): {listed}{more}.")

    def edge_error(self) -> errors.EdgeError:
        first = self.problems[0] if self.problems else None
        return errors.EdgeError(400, str(self), code=self.code, param=first.param if first else None)


def parse_batch_file(data: bytes, limits: BatchSettings) -> list[BatchLine]:
    """Every line of a batch input file, or :class:`InvalidBatchFile` naming each bad line."""
    if len(data) > limits.max_file_bytes:
        raise InvalidBatchFile([LineProblem(0, f"the file is {len(data)} bytes; the limit is "
                                                f"{int(limits.max_file_bytes)} bytes (batch.max_file_bytes)")],
                               code="file_too_large")
    lines, problems, seen = [], [], {}
    raw_lines = data.split(b"\n")
    if len([raw for raw in raw_lines if raw.strip()]) > limits.max_lines:
        raise InvalidBatchFile([LineProblem(0, f"the file has more than {limits.max_lines} lines (batch.max_lines)")],
                               code="too_many_lines")
    for number, raw in enumerate(raw_lines, start=1):
        if not raw.strip():
            continue
        try:
            line = parse_line(number, raw, limits)
        except LineError as error:
            problems.append(error.problem)
            continue
        if line.custom_id in seen:
            problems.append(LineProblem(number, f"custom_id {line.custom_id!r} is also on line "
                                                f"{seen[line.custom_id]}; each must be unique", "custom_id"))
            continue
        seen[line.custom_id] = number
        lines.append(line)
    if not lines and not problems:
        problems.append(LineProblem(1, "the file has no lines"))
    if problems:
        raise InvalidBatchFile(problems)
    return lines


class LineError(Exception):
    def __init__(self, problem: LineProblem) -> None:
        super().__init__(str(problem))
        self.problem = problem


def parse_line(number: int, raw: bytes, limits: BatchSettings) -> BatchLine:
    """One line of the file (``number`` 1-based), or :class:`LineError`."""
    def fail(message: str, param: str | None = None) -> LineError:
        return LineError(LineProblem(number, message, param))

    if len(raw) > limits.max_line_bytes:
        raise fail(f"the line is {len(raw)} bytes; the limit is {int(limits.max_line_bytes)} (batch.max_line_bytes)")
    try:
        item = decode_json(raw, what="line")
    except errors.EdgeError as error:
        raise fail(error.message) from None
    unknown = sorted(set(item) - _LINE_KEYS)
    if unknown:
        raise fail(f"unknown field {unknown[0]!r}; a line has custom_id, method, url and body", unknown[0])
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > 512:
        raise fail("custom_id must be a non-empty string of at most 512 characters", "custom_id")
    if item.get("method") != "POST":
        raise fail(f"method must be 'POST', got {item.get('method')!r}", "method")
    url = item.get("url")
    body_type = ENDPOINTS.get(url) if isinstance(url, str) else None
    if body_type is None:
        raise fail(f"url {url!r} is not supported; use one of {', '.join(ENDPOINTS)}", "url")
    return BatchLine(number, custom_id, url, _body(body_type, item.get("body"), fail))


def _body(body_type: type[Body], data: Any, fail: Any) -> Body:
    if not isinstance(data, dict):
        raise fail(f"body must be a JSON object, got {type(data).__name__}", "body")
    try:
        body = parse_body(body_type, data)
    except errors.EdgeError as error:
        raise fail(error.message, f"body.{error.param}" if error.param else "body") from None
    if body.streams:
        raise fail("stream is not supported in a batch; each line's answer is written whole", "body.stream")
    if body.choices > 1:
        raise fail("n > 1 is not supported in a batch yet; send one line per choice (with its own seed)", "body.n")
    if body.echoes() and body.prompt_tokens_input() is not None:
        raise fail("echo of a prompt given as token ids is not supported in a batch (its text is not decoded there)",
                   "body.echo")
    return body


def upload_validator(limits: BatchSettings) -> Callable[[Path, str], None]:
    """The files store's check of a ``purpose="batch"`` upload (:mod:`streams.files.purposes`): its
    ``InvalidFile`` (a 400) names the bad lines."""
    def check(path: Path, filename: str) -> None:
        from streams.files.purposes import InvalidFile

        try:
            parse_batch_file(path.read_bytes(), limits)
        except InvalidBatchFile as invalid:
            raise InvalidFile(str(invalid), param="file") from None

    return check


def dumps_line(custom_id: str, url: str, body: dict[str, Any]) -> str:
    """One input line, as a client writes it (tests, the benchmark)."""
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})
