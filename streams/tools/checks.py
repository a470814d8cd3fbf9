"""An intent's checks before any tool runs: the allowlist, the tenant's permission, the arguments' JSON schema.

The worker only publishes intents for registered tools with arguments the grammar already shaped, but the
tool-intents topic is an input like any other (``specstream tools call``, a bug, a hostile producer), so the
runner checks everything again; arguments that fail never reach a tool.
"""
from __future__ import annotations

import functools
import json

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from schemas.tools import ToolError, ToolIntent
from streams.config.tools import ToolSettings


def refusal(intent: ToolIntent, registry: dict[str, ToolSettings]) -> ToolError | None:
    """Why the intent may not run, or None."""
    tool = registry.get(intent.tool)
    if tool is None:
        return ToolError(code="unknown_tool", message=f"no server-side tool {intent.tool!r}; registered: "
                         f"{', '.join(sorted(registry)) or 'none'}")
    if not tool.allows(intent.tenant):
        return ToolError(code="permission_denied", message=f"tenant {intent.tenant!r} may not call {intent.tool!r}")
    error = _first_error(intent.tool, json.dumps(tool.parameters, sort_keys=True), intent.arguments)
    if error is not None:
        return ToolError(code="rejected", message=error)
    return None


def _first_error(tool: str, schema_json: str, arguments: dict[str, object]) -> str | None:
    best: ValidationError | None = None
    for error in _validator(schema_json).iter_errors(arguments):
        if best is None or len(error.path) < len(best.path):
            best = error
    if best is None:
        return None
    where = "/".join(str(p) for p in best.absolute_path) or "(the arguments)"
    return f"arguments of {tool!r} fail its schema at {where}: {best.message}"


@functools.lru_cache(maxsize=64)
def _validator(schema_json: str) -> Draft202012Validator:
    return Draft202012Validator(json.loads(schema_json))
