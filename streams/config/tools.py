"""The `tools` section: the server-side tool registry, the sandbox, and the tool runner's service settings.

A tool the model calls by a name in ``tools.registry`` runs on the server (a ToolIntent on the bus, executed by a
tool runner); any other name goes back to the client as an ordinary ``tool_calls`` entry.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from streams.config.base import MIB, ByteSize, Section
from streams.config.services import WorkerSettings

_PYTHON_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"code": {"type": "string", "maxLength": 65536, "description": "Python 3 source to run."}},
    "required": ["code"],
    "additionalProperties": False,
}
_CALCULATOR_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"expression": {"type": "string", "maxLength": 1000,
                                  "description": "Arithmetic: numbers, + - * / // % **, parentheses."}},
    "required": ["expression"],
    "additionalProperties": False,
}
_FILE_SEARCH_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "minLength": 1, "maxLength": 4096, "description": "What to look for."},
        "max_num_results": {"type": "integer", "minimum": 1, "maximum": 50, "description": "Passages to return."},
        "vector_store_ids": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 8,
                             "description": "Stores to search; default: the tool's configured stores."},
    },
    "required": ["query"],
    "additionalProperties": False,
}


class ToolSettings(Section):
    executor: Literal["calculator", "python", "file_search"] = Field(
        description="What runs it: calculator (arithmetic in the runner, no eval), python (a snippet in the sandbox) "
        "or file_search (a search of vector stores through the rag service's retriever).",
    )
    description: str = Field(default="", description="What the tool does, for the model.")
    parameters: dict[str, Any] = Field(description="JSON schema of its arguments; the runner validates every call.")
    tenants: list[str] = Field(default_factory=lambda: ["*"], description="Tenants allowed to call it; '*': every tenant.")
    timeout_s: float = Field(default=5.0, gt=0, le=600, description="Wall-clock limit of one call.")
    cpu_s: int = Field(default=5, ge=1, le=600, description="CPU-time limit of one call (RLIMIT_CPU).")
    memory_bytes: ByteSize = Field(default=256 * MIB, ge=32 * MIB, description="Address-space limit (RLIMIT_AS).")
    max_output_bytes: ByteSize = Field(
        default=64 * 1024, ge=256, le=4 * MIB, description="stdout + stderr kept; beyond it the call is stopped, truncated.",
    )
    max_processes: int = Field(default=16, ge=2, le=4096, description="Processes and threads of one call (RLIMIT_NPROC).")
    max_file_bytes: ByteSize = Field(default=16 * MIB, ge=4096, description="Largest file it may write (RLIMIT_FSIZE).")
    tmp_bytes: ByteSize = Field(default=32 * MIB, ge=MIB, description="Size of its private writable /tmp (tmpfs).")
    vector_store_ids: list[str] = Field(
        default_factory=list, max_length=8,
        description="file_search: stores searched when a call names none; each must belong to the calling tenant.",
    )

    @model_validator(mode="after")
    def _stores_only_for_file_search(self) -> ToolSettings:
        if self.vector_store_ids and self.executor != "file_search":
            raise ValueError(f"vector_store_ids is for the file_search executor, not {self.executor}")
        return self

    @field_validator("parameters")
    @classmethod
    def _valid_schema(cls, schema: dict[str, Any]) -> dict[str, Any]:
        from jsonschema import Draft202012Validator
        from jsonschema.exceptions import SchemaError

        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as error:
            raise ValueError(f"not a valid JSON schema: {error.message}") from None
        return schema

    def allows(self, tenant: str) -> bool:
        return "*" in self.tenants or tenant in self.tenants


def _default_registry() -> dict[str, ToolSettings]:
    return {
        "calculator": ToolSettings(executor="calculator", parameters=_CALCULATOR_PARAMETERS, timeout_s=1.0,
                                   description="Evaluate an arithmetic expression exactly."),
        "python": ToolSettings(executor="python", parameters=_PYTHON_PARAMETERS,
                               description="Run a Python 3 snippet in a sandbox (no network, private /tmp); "
                               "returns its stdout, stderr and exit status."),
        "file_search": ToolSettings(executor="file_search", parameters=_FILE_SEARCH_PARAMETERS, timeout_s=10.0,
                                    max_output_bytes=16 * 1024,
                                    description="Search the tenant's vector stores for passages relevant to a "
                                    "query; returns file_id, filename, score and text of each, best first."),
    }


class SandboxSettings(Section):
    bwrap: str = Field(default="bwrap", min_length=1, description="The bubblewrap binary (Debian: bubblewrap).")
    python: str = Field(default="/usr/bin/python3", min_length=1,
                        description="Interpreter of `python` calls; must live under a path the sandbox binds (/usr).")
    uid_base: int = Field(
        default=61000, ge=1000, le=2**31 - 2**16,
        description="Calls run as uid/gid uid_base + slot (one per concurrent call), never as the runner's user, "
        "so the process limit counts each call alone.",
    )
    seccomp: bool = Field(default=True, description="Deny sockets (but AF_UNIX) and kernel-admin syscalls (x86-64).")


class ToolRunnerSettings(WorkerSettings):
    id: str | None = Field(
        default=None, min_length=1, max_length=128, pattern=r"^[a-zA-Z0-9._-]+$",
        description="Tool runner id in announcements, results and dead letters; null: <hostname>-<pid>.",
    )
    group_id: str | None = Field(
        default=None, min_length=1, description="Consumer group of the tool-intents topic; null: <topic_prefix>.tool-runners."
    )
    max_message_bytes: ByteSize = Field(
        default=MIB, ge=1024, description="Larger intent messages are rejected (message_too_large) and dead-lettered."
    )
    max_inflight: int = Field(default=4, ge=1, le=256, description="Tool calls a runner executes at once.")
    drain_timeout_s: float = Field(default=10.0, ge=0, description="On shutdown, seconds to finish running calls.")

    def resolved_group_id(self, topic_prefix: str) -> str:
        return self.group_id or f"{topic_prefix}.tool-runners"


class ToolsSettings(Section):
    max_rounds: int = Field(
        default=3, ge=0, le=16,
        description="Rounds of server-side tool calls per request; then the model must answer (0: never run tools).",
    )
    result_timeout_s: float = Field(
        default=30.0, gt=0, description="How long a worker waits for a call's result before it answers no_result.",
    )
    retention_h: float = Field(default=168.0, gt=0, description="Hours the tool-intents and tool-results topics "
                               "keep every call (the audit log).")
    registry: dict[str, ToolSettings] = Field(
        default_factory=_default_registry, description="Server-side tools by name (calculator, python and file_search ship).",
    )
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    runner: ToolRunnerSettings = Field(default_factory=ToolRunnerSettings)

    @field_validator("registry")
    @classmethod
    def _names(cls, registry: dict[str, ToolSettings]) -> dict[str, ToolSettings]:
        import re

        for name in registry:
            if not re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", name):
                raise ValueError(f"tool name {name!r} must be 1-64 letters, digits, '_' or '-'")
        return registry
