"""One definition per error code and finish reason: schemas/events.py declares them (the frozen bus contract), and
every other module names them through that declaration, so a code or a reason cannot be added, renamed or dropped
in one place and forgotten in another."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

from schemas.events import BusErrorCode, ErrorCode, FinishReason

REPO = Path(__file__).resolve().parents[2]
TREES = ("engine", "streams", "schemas")
OWNER = "schemas/events.py"
# The engine cannot import schemas (it runs without the bus): its literal mirrors the bus's, and
# tests/unit/test_names.py holds the two equal.
MIRRORS = {"engine/outputs.py"}
DECLARATIONS = frozenset({"FinishReason", "BusErrorCode", "ErrorCode"})
REASONS = frozenset(get_args(FinishReason))
CODES = frozenset(get_args(ErrorCode)) - {"regeneration_diverged"}  # BusErrorCode's, through ErrorCode's union


def _modules() -> list[tuple[str, ast.Module]]:
    return [(str(path.relative_to(REPO)), ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
            for tree in TREES for path in sorted((REPO / tree).rglob("*.py"))]


def _strings(nodes: list[ast.expr | None]) -> frozenset[str]:
    return frozenset(n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str))


def _listed(strings: frozenset[str]) -> bool:
    """Two or more reasons, or two or more codes: a list of them, not one named in passing."""
    return len(strings & REASONS) >= 2 or len(strings & CODES) >= 2


def _literal_members(node: ast.Subscript) -> frozenset[str]:
    if not (isinstance(node.value, ast.Name) and node.value.id == "Literal"):
        return frozenset()
    return _strings(list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice])


def test_the_literals_are_declared_once() -> None:
    declared = [f"{path}:{node.lineno}" for path, module in _modules() if path != OWNER and path not in MIRRORS
                for node in ast.walk(module) if isinstance(node, ast.Subscript) and _listed(_literal_members(node))]
    assert not declared, f"a second Literal of finish reasons or error codes (import schemas.events'): {declared}"


def _typed_by_a_declaration(annotation: ast.expr | None) -> bool:
    return annotation is not None and any(isinstance(n, ast.Name) and n.id in DECLARATIONS
                                          for n in ast.walk(annotation))


def _collections(module: ast.Module) -> list[tuple[ast.expr, ast.expr | None]]:
    """Each tuple, list, set or dict literal (not a Literal[...]'s members), with the annotation of the name it is
    assigned to (if any)."""
    annotated = {id(node.value): node.annotation for node in ast.walk(module)
                 if isinstance(node, ast.AnnAssign) and node.value is not None}
    subscripts = {id(node.slice) for node in ast.walk(module) if isinstance(node, ast.Subscript)}
    return [(node, annotated.get(id(node))) for node in ast.walk(module)
            if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)) and id(node) not in subscripts]


def test_every_list_of_reasons_or_codes_is_typed_by_the_declaration() -> None:
    untyped = []
    for path, module in _modules():
        if path == OWNER or path in MIRRORS:
            continue
        for node, annotation in _collections(module):
            members = _strings(list(node.keys) if isinstance(node, ast.Dict) else list(node.elts))
            if _listed(members) and not _typed_by_a_declaration(annotation):
                untyped.append(f"{path}:{node.lineno} {sorted(members & (REASONS | CODES))}")
    assert not untyped, f"annotate these with FinishReason / BusErrorCode / ErrorCode (schemas.events): {untyped}"


def test_the_scan_finds_a_second_declaration_and_an_untyped_list() -> None:
    module = ast.parse('Reason = Literal["stop", "length"]\nRETRY = ("overloaded", "internal_error")\n'
                       'OK: tuple[FinishReason, ...] = ("abort", "deadline")\n')
    literals = [n for n in ast.walk(module) if isinstance(n, ast.Subscript) and _literal_members(n)]
    assert [_listed(_literal_members(n)) for n in literals] == [True]
    flagged = [_listed(_strings(list(n.elts))) and not _typed_by_a_declaration(a) for n, a in _collections(module)
               if isinstance(n, ast.Tuple) and _strings(list(n.elts))]
    assert flagged == [True, False]


def test_the_edge_answers_every_bus_error_code_with_its_own_status() -> None:
    from streams.wire.errors import _WORKER_ERRORS

    assert set(_WORKER_ERRORS) == set(get_args(BusErrorCode))
