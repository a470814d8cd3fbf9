"""One batch line's outcome as a line of the batch's output or error file, in OpenAI's format.

* answered: ``{"id", "custom_id", "response": {"status_code": 200, "request_id", "body"}, "error": null}`` in
  the output file, the body being exactly what the endpoint returns interactively
  (:func:`streams.wire.answers.completion_body`);
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
from streams.wire.answers import completion_body

Outcome = Literal["completed", "failed", "expired", "cancelled"]
_NOT_RUN: dict[BusErrorCode, tuple[Outcome, str]] = {
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
    base = {"id": _record_id(request.request_id), "custom_id": custom_id}
    if isinstance(answer, Completion):
        response = {"status_code": 200, "request_id": request.request_id,
                    "body": completion_body(request, answer, chat=chat)}
        return LineOutcome(line, custom_id, "completed", {**base, "response": response, "error": None})
    not_run = _NOT_RUN.get(answer.code)
    if not_run is not None:
        outcome, code = not_run
        return LineOutcome(line, custom_id, outcome,
                           {**base, "response": None, "error": {"code": code, "message": answer.message}})
    error = errors.from_worker_error(answer, input_param="messages" if chat else "prompt")
    response = {"status_code": error.status, "request_id": request.request_id, "body": error.body()}
    return LineOutcome(line, custom_id, "failed", {**base, "response": response, "error": None})
