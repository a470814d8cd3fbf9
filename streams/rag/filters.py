"""OpenAI's attribute filters (comparison and compound) as a Qdrant filter on the points' `attributes`.

A comparison is `{"key", "type": eq|ne|gt|gte|lt|lte|in|nin, "value"}`; a compound is
`{"type": and|or, "filters": [...]}`, nested freely. A filter that is neither raises ValueError naming
the part that is wrong (the edge answers 400 with it).

Checking (:func:`check_filter`) and converting (:func:`to_qdrant`) are apart: the edge only checks, and
importing qdrant_client costs a process ~2.5 s of its start on 2 cores, for a module it never uses.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from qdrant_client import models as qm

MAX_DEPTH = 8
_COMPARISONS = ("eq", "ne", "gt", "gte", "lt", "lte", "in", "nin")
_RANGES = ("gt", "gte", "lt", "lte")


@dataclass(frozen=True)
class Comparison:
    key: str
    kind: str  # one of _COMPARISONS
    value: Any


@dataclass(frozen=True)
class Compound:
    kind: str  # and | or
    parts: tuple[Comparison | Compound, ...]


def check_filter(spec: dict[str, Any] | None) -> Comparison | Compound | None:
    """The filter, checked: raises ValueError naming the part that is wrong."""
    return None if spec is None else _parse(spec, "filters", 0)


def to_qdrant(spec: dict[str, Any] | None) -> qm.Filter | None:
    parsed = check_filter(spec)
    if parsed is None:
        return None
    from qdrant_client import models as qm

    condition = _convert(parsed, qm)
    return condition if isinstance(condition, qm.Filter) else qm.Filter(must=[condition])


def _parse(spec: Any, where: str, depth: int) -> Comparison | Compound:
    if not isinstance(spec, dict):
        raise ValueError(f"{where}: expected an object")
    kind = spec.get("type")
    if depth > MAX_DEPTH:
        raise ValueError(f"{where}: filters nest deeper than {MAX_DEPTH}")
    if kind in ("and", "or"):
        parts = spec.get("filters")
        if not isinstance(parts, list) or not parts:
            raise ValueError(f"{where}.filters: a non-empty list is required for type {kind!r}")
        return Compound(kind, tuple(_parse(p, f"{where}.filters[{i}]", depth + 1) for i, p in enumerate(parts)))
    return _comparison(spec, where, kind)


def _comparison(spec: dict[str, Any], where: str, kind: Any) -> Comparison:
    key, value = spec.get("key"), spec.get("value")
    if not isinstance(key, str) or not key:
        raise ValueError(f"{where}.key: a non-empty string is required")
    if kind not in _COMPARISONS:
        raise ValueError(f"{where}.type: {kind!r} is not one of eq, ne, gt, gte, lt, lte, in, nin, and, or")
    if kind in ("eq", "ne") and not isinstance(value, (str, int, float, bool)):
        raise ValueError(f"{where}.value: a string, number or boolean is required for {kind!r}")
    if kind in _RANGES and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ValueError(f"{where}.value: a number is required for {kind!r}")
    if kind in ("in", "nin") and (not isinstance(value, list) or not value
                                  or not all(isinstance(v, (str, int)) for v in value)):
        raise ValueError(f"{where}.value: a non-empty list of strings or integers is required for {kind!r}")
    return Comparison(key, kind, value)


def _convert(node: Comparison | Compound, qm: Any) -> qm.Filter | qm.FieldCondition:
    if isinstance(node, Compound):
        conditions = [_convert(part, qm) for part in node.parts]
        return qm.Filter(must=conditions) if node.kind == "and" else qm.Filter(should=conditions)
    field, value = f"attributes.{node.key}", node.value
    if node.kind in _RANGES:
        return qm.FieldCondition(key=field, range=qm.Range(**{node.kind: value}))
    if node.kind in ("in", "nin"):
        match = qm.FieldCondition(key=field, match=qm.MatchAny(any=value))
        return match if node.kind == "in" else qm.Filter(must_not=[match])
    # eq / ne: a whole number or a string matches exactly; a fractional number is a one-point range.
    match = (qm.FieldCondition(key=field, match=qm.MatchValue(value=value))
             if isinstance(value, (str, bool)) or float(value).is_integer()
             else qm.FieldCondition(key=field, range=qm.Range(gte=value, lte=value)))
    return match if node.kind == "eq" else qm.Filter(must_not=[match])
