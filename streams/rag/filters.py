"""OpenAI's attribute filters (comparison and compound) as a Qdrant filter on the points' `attributes`.

A comparison is `{"key", "type": eq|ne|gt|gte|lt|lte|in|nin, "value"}`; a compound is
`{"type": and|or, "filters": [...]}`, nested freely. A filter that is neither raises ValueError naming
the part that is wrong (the edge answers 400 with it).
"""
from __future__ import annotations

from typing import Any

from qdrant_client import models as qm

_RANGES = {"gt": "gt", "gte": "gte", "lt": "lt", "lte": "lte"}
MAX_DEPTH = 8


def to_qdrant(spec: dict[str, Any] | None) -> qm.Filter | None:
    if spec is None:
        return None
    condition = _condition(spec, "filters", 0)
    return condition if isinstance(condition, qm.Filter) else qm.Filter(must=[condition])


def _condition(spec: Any, where: str, depth: int) -> qm.Filter | qm.FieldCondition:
    if not isinstance(spec, dict):
        raise ValueError(f"{where}: expected an object")
    kind = spec.get("type")
    if depth > MAX_DEPTH:
        raise ValueError(f"{where}: filters nest deeper than {MAX_DEPTH}")
    if kind in ("and", "or"):
        parts = spec.get("filters")
        if not isinstance(parts, list) or not parts:
            raise ValueError(f"{where}.filters: a non-empty list is required for type {kind!r}")
        conditions = [_condition(p, f"{where}.filters[{i}]", depth + 1) for i, p in enumerate(parts)]
        return qm.Filter(must=conditions) if kind == "and" else qm.Filter(should=conditions)
    return _comparison(spec, where, kind)


def _comparison(spec: dict[str, Any], where: str, kind: Any) -> qm.Filter | qm.FieldCondition:
    key, value = spec.get("key"), spec.get("value")
    if not isinstance(key, str) or not key:
        raise ValueError(f"{where}.key: a non-empty string is required")
    field = f"attributes.{key}"
    if kind in ("eq", "ne"):
        if not isinstance(value, (str, int, float, bool)):
            raise ValueError(f"{where}.value: a string, number or boolean is required for {kind!r}")
        match = (qm.FieldCondition(key=field, match=qm.MatchValue(value=value))
                 if isinstance(value, (str, bool)) or float(value).is_integer()
                 else qm.FieldCondition(key=field, range=qm.Range(gte=value, lte=value)))
        return match if kind == "eq" else qm.Filter(must_not=[match])
    if kind in _RANGES:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where}.value: a number is required for {kind!r}")
        return qm.FieldCondition(key=field, range=qm.Range(**{_RANGES[kind]: value}))
    if kind in ("in", "nin"):
        if not isinstance(value, list) or not value or not all(isinstance(v, (str, int)) for v in value):
            raise ValueError(f"{where}.value: a non-empty list of strings or integers is required for {kind!r}")
        match = qm.FieldCondition(key=field, match=qm.MatchAny(any=value))
        return match if kind == "in" else qm.Filter(must_not=[match])
    raise ValueError(f"{where}.type: {kind!r} is not one of eq, ne, gt, gte, lt, lte, in, nin, and, or")
