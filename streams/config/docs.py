"""The configuration documents itself: the example file and docs/configuration.md's reference table."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from streams.config.base import ENV_NESTED_DELIMITER, ENV_PREFIX
from streams.config.loading import Settings


def _fields(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], FieldInfo]]:
    """Every leaf setting as (path, field), depth first in declaration order."""
    leaves: list[tuple[tuple[str, ...], FieldInfo]] = []
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            leaves += _fields(annotation, (*prefix, name))
        else:
            leaves.append(((*prefix, name), info))
    return leaves


def _default(info: FieldInfo) -> Any:
    from pydantic_core import to_jsonable_python

    # A mapping of sections (tools.registry) is one setting: written as its JSON.
    return to_jsonable_python(info.get_default(call_default_factory=True))


def _yaml_scalar(value: Any) -> str:
    import json

    return json.dumps(value)  # JSON scalars are valid YAML: null, true, 8, 0.3, "text"


def example_yaml() -> str:
    """config.example.yaml: every key at its default, each with its description (kept in sync by a unit test)."""
    lines = [
        "# specstream configuration: every key with its default value.",
        "# Copy to ./specstream.yaml (read automatically) or pass --config FILE; delete what you do not change.",
        f"# Environment variables override the file: {ENV_PREFIX}<SECTION>{ENV_NESTED_DELIMITER}<KEY>, e.g.",
        f"#   {ENV_PREFIX}KAFKA{ENV_NESTED_DELIMITER}BOOTSTRAP_SERVERS=broker:9092",
        f"#   {ENV_PREFIX}ENGINE{ENV_NESTED_DELIMITER}SPECULATION{ENV_NESTED_DELIMITER}ENABLED=false",
        "# Unknown keys are errors. Check a file with: specstream config check FILE",
    ]
    opened: tuple[str, ...] = ()
    for path, info in _fields(Settings):
        section = path[:-1]
        for depth in range(len(section)):
            if opened[: depth + 1] != section[: depth + 1]:
                lines += ["", f"{'  ' * depth}{section[depth]}:"]
        opened = section
        indent = "  " * len(section)
        if not section:
            lines.append("")
        if info.description:
            lines.append(f"{indent}# {info.description}")
        lines.append(f"{indent}{path[-1]}: {_yaml_scalar(_default(info))}")
    return "\n".join(lines) + "\n"


def reference_markdown() -> str:
    """docs/configuration.md's reference table (kept in sync by a unit test)."""
    rows = ["| key | default | environment variable | meaning |", "|---|---|---|---|"]
    for path, info in _fields(Settings):
        env_name = ENV_PREFIX + ENV_NESTED_DELIMITER.join(path).upper()
        description = (info.description or "").replace("|", "\\|")
        rows.append(f"| `{'.'.join(path)}` | `{_yaml_scalar(_default(info))}` | `{env_name}` | {description} |")
    return "\n".join(rows)
