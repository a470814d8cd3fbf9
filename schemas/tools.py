"""Events of server-side tool calls: the intent a worker publishes, the result a tool runner answers with.

Both topics are kept as the audit log of every call (who asked, with what, what came back). Results are keyed
by ``call_id``; a call id is derived from the request id and the call's position in the answer
(:func:`call_id`), so the edge that streams the call and the worker that publishes its intent name it alike,
and a regenerated answer (after a redelivery) names its calls as before.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas.base import Event

ToolErrorCode = Literal[
    "unknown_tool",  # not in the registry
    "permission_denied",  # the tenant may not call it
    "rejected",  # the arguments fail the tool's JSON schema (the message names the path)
    "timeout",  # wall-clock or CPU-time limit
    "memory_limit",  # address-space limit
    "output_limit",  # more output than the tool may print; what came before is kept (truncated)
    "nonzero_exit",  # the snippet exited with a non-zero status (or an uncaught exception)
    "invalid_expression",  # calculator: not arithmetic, or beyond its bounds
    "deadline_exceeded",  # the intent's deadline passed before it ran
    "sandbox_error",  # the sandbox itself failed to start
    "no_result",  # the worker waited for a result in vain (the runner is down or too slow)
    "not_found",  # file_search: a vector store that does not exist
    "retrieval_failed",  # file_search: the retriever answered with an error
]


def call_id(request_id: str, index: int) -> str:
    """The id of a request's ``index``-th tool call (0-based, across all rounds), as OpenAI's ``call_...`` ids."""
    return "call_" + hashlib.sha256(f"{request_id}/{index}".encode()).hexdigest()[:24]


class ToolIntent(Event):
    """A call of a server-side tool, published by the engine worker (or `specstream tools call`) to the
    tool-intents topic, keyed by call_id; a tool runner executes it once and publishes its ToolResult."""

    type: Literal["tool_intent"] = "tool_intent"
    request_id: str = Field(min_length=1, max_length=128, description="The generation request that made the call.")
    call_id: str = Field(min_length=1, max_length=128, description="The call's id; its ToolResult carries it.")
    tool: str = Field(min_length=1, max_length=64, description="Name of the registered tool.")
    arguments: dict[str, Any] = Field(description="The arguments, already parsed from the model's JSON.")
    tenant: str = Field(min_length=1, max_length=64, description="Tenant of the request; checked against the tool's tenants.")
    deadline: float | None = Field(
        default=None, description="Unix time after which the result is useless; an intent read later is not run.",
    )
    created_at: float | None = Field(default=None, description="Unix time the intent was published.")


class ToolError(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    code: ToolErrorCode = Field(description="What stopped or refused the call.")
    message: str = Field(description="One line for the model and the operator, naming the limit or the field.")


class ToolResult(Event):
    """The outcome of one ToolIntent, on the tool-results topic keyed by call_id: an output, or an error (a call
    stopped by a limit may have both: what it printed before it was stopped)."""

    type: Literal["tool_result"] = "tool_result"
    request_id: str = Field(description="The generation request that made the call.")
    call_id: str = Field(description="The call this answers.")
    tool: str = Field(description="Name of the tool.")
    output: Any = Field(
        default=None, description="The tool's JSON output: a number (calculator); stdout, stderr, exit_status (python); "
        "results: [{file_id, filename, vector_store_id, score, text, attributes}] (file_search).",
    )
    error: ToolError | None = Field(default=None, description="Why the call failed or was refused; None: it succeeded.")
    duration_s: float = Field(ge=0, description="Seconds from reading the intent to the result.")
    truncated: bool = Field(default=False, description="The output was cut at the tool's output limit.")
    runner_id: str = Field(default="", description="The tool runner that answered.")

    def content(self) -> str:
        """The result as the `tool` message the model reads next (JSON)."""
        body: dict[str, Any] = {"output": self.output}
        if self.error is not None:
            body["error"] = self.error.model_dump()
        if self.truncated:
            body["truncated"] = True
        return json.dumps(body, ensure_ascii=False)
