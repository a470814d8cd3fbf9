"""One batch line's outcome as a line of the batch's output or error file, in OpenAI's format.

* answered: ``{"id", "custom_id", "response": {"status_code": 200, "request_id", "body"}, "error": null}`` in
  the output file, the body being exactly what the endpoint returns interactively
  (:func:`streams.wire.answers.completion`; the line is :class:`streams.wire.batch_models.BatchOutputLine`);
* failed at run time (context too long, unknown model): the same shape with the status and OpenAI error body the
  endpoint would have answered, in the error file;
* not run (the batch expired or was cancelled first): ``"response": null`` and ``"error": {"code", "message"}``
  (``batch_expired`` / ``batch_cancelled``), in the error file.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal

from schemas.events import BusErrorCode, Completion, ErrorEvent, GenerateRequest
from streams.wire import errors
from streams.wire.answers import completion
from streams.wire.batch_models import (
    BatchLineNotRun,
    BatchLineResponse,
    BatchOutputLine,
)

Outcome = Literal["completed", "failed", "expired", "cancelled"]
_NOT_RUN: dict[BusErrorCode, tuple[Outcome, Literal["batch_expired", "batch_cancelled"]]] = {
    "deadline_exceeded": ("expired", "batch_expired"),
    "cancelled": ("cancelled", "batch_cancelled"),
}


@dataclass(frozen=True)
class LineOutcome:
    line: int
    custom_id: str
    outcome: Outcome
    record: dict[str, Any]  # the file line

    @property
    def to_output_file(self) -> bool:
        return self.outcome == "completed"

    def dumps(self) -> str:
        return json.dumps(self.record, separators=(",", ":"), ensure_ascii=False)


def _record_id(request_id: str) -> str:
    # OpenAI's per-line id; stable for a line, so a rewritten file is the same file.
    return "batch_req_" + hashlib.sha256(request_id.encode()).hexdigest()[:24]


def outcome_of(request: GenerateRequest, custom_id: str, line: int, answer: Completion | ErrorEvent) -> LineOutcome:
    """The file line of ``answer`` to the line's ``request`` (rebuilt from the input file)."""
    chat = request.messages is not None
    record_id = _record_id(request.request_id)
    if isinstance(answer, Completion):
        response = BatchLineResponse(status_code=200, request_id=request.request_id,
                                     body=completion(request, answer, chat=chat))
        return _outcome(line, "completed", BatchOutputLine(id=record_id, custom_id=custom_id, response=response,
                                                           error=None))
    not_run = _NOT_RUN.get(answer.code)
    if not_run is not None:
        outcome, code = not_run
        return _outcome(line, outcome, BatchOutputLine(id=record_id, custom_id=custom_id, response=None,
                                                       error=BatchLineNotRun(code=code, message=answer.message)))
    error = errors.from_worker_error(answer, input_param="messages" if chat else "prompt")
    response = BatchLineResponse(status_code=error.status, request_id=request.request_id,
                                 body=error.answer())
    return _outcome(line, "failed", BatchOutputLine(id=record_id, custom_id=custom_id, response=response, error=None))


def _outcome(line: int, outcome: Outcome, record: BatchOutputLine) -> LineOutcome:
    return LineOutcome(line, record.custom_id, outcome, record.model_dump())
