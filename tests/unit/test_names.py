"""Names say what a thing is: one class name means one thing across engine/, streams/ and schemas/, and a literal
the engine and the bus share is declared so that the two cannot drift apart."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

REPO = Path(__file__).resolve().parents[2]
TREES = ("engine", "streams", "schemas")

# Names two modules declare for what truly is one thing: a private `extra="forbid"` base of request bodies.
SAME_THING = frozenset({"_Strict"})
# Names that still mean two things: debt that must only shrink (the test fails when one is gone too, so the list
# stays true).
KNOWN_COLLISIONS: frozenset[str] = frozenset()


def classes_by_name() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for tree in TREES:
        for path in sorted((REPO / tree).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
                if isinstance(node, ast.ClassDef):
                    found.setdefault(node.name, []).append(str(path.relative_to(REPO)))
    return found


def test_no_new_class_name_means_two_things() -> None:
    doubled = {name: paths for name, paths in classes_by_name().items() if len(paths) > 1}
    new = {name: paths for name, paths in doubled.items() if name not in SAME_THING | KNOWN_COLLISIONS}
    assert not new, f"class names declared more than once (rename one, or list it in SAME_THING): {new}"


def test_every_listed_collision_still_exists() -> None:
    gone = sorted(name for name in KNOWN_COLLISIONS if len(classes_by_name().get(name, [])) < 2)
    assert not gone, f"no longer collide, remove from KNOWN_COLLISIONS: {gone}"


def test_the_engine_and_the_bus_agree_on_why_a_generation_ended() -> None:
    from engine.outputs import FinishReason as EngineFinishReason
    from schemas.events import FinishReason

    assert get_args(EngineFinishReason) == get_args(FinishReason)

