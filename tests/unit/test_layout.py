"""The layout of ``streams/``: one folder per concern, imports running one way, command-line code in one place.

The import graph is read from the source (every ``import`` and ``from ... import`` of every module, at module level
and inside functions alike: a function-level import is a dependency too, only a later one), never by importing it.
Its nodes are the rooms of ``streams/``: each subpackage, and each module still at the root.
"""
from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

STREAMS = Path(__file__).resolve().parents[2] / "streams"

# What may sit at the root of streams/ besides packages: the package itself, the `specstream` entry point, and two
# one-module rooms (the bus's AsyncAPI document, the supervisor of `specstream up`'s children). Kafka plumbing,
# command-line code and anything else goes into the package of its concern.
ROOT_MODULES = frozenset({"__init__", "cli", "asyncapi", "supervisor"})


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(STREAMS.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path: Path) -> Iterator[str]:
    """Every module ``path`` imports, relative imports resolved; ``from pkg import name`` yields ``pkg.name`` too."""
    module = _module_name(path)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            yield target
            # `from streams.kafka import clients` names a module, not an attribute: the room is the name's.
            yield from (f"{target}.{alias.name}" for alias in node.names)


def _room(module: str) -> str | None:
    """The subpackage (or root module) of streams/ that ``module`` lives in; None outside streams/ or for the root."""
    parts = module.split(".")
    if parts[0] != "streams" or len(parts) < 2:
        return None
    name = parts[1]
    return name if (STREAMS / name).is_dir() or (STREAMS / f"{name}.py").is_file() else None


def room_imports() -> dict[str, dict[str, set[str]]]:
    """room -> imported room -> the modules of the first room that import the second."""
    graph: dict[str, dict[str, set[str]]] = {}
    for path in sorted(STREAMS.rglob("*.py")):
        source = _room(_module_name(path))
        if source is None:
            continue
        for target in filter(None, map(_room, _imported(path))):
            if target != source:
                graph.setdefault(source, {}).setdefault(target, set()).add(_module_name(path))
    return graph


def cycle_edges(graph: dict[str, dict[str, set[str]]]) -> set[tuple[str, str]]:
    """The imports that close a cycle: both ends in one strongly connected component (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    component: dict[str, int] = {}

    def visit(room: str) -> None:
        index[room] = low[room] = len(index)
        stack.append(room)
        for target in graph.get(room, {}):
            if target not in index:
                visit(target)
                low[room] = min(low[room], low[target])
            elif target in stack:
                low[room] = min(low[room], index[target])
        if low[room] == index[room]:
            while True:
                member = stack.pop()
                component[member] = index[room]
                if member == room:
                    break

    for room in sorted(graph):
        if room not in index:
            visit(room)
    return {(source, target) for source, targets in graph.items() for target in targets
            if component.get(source) == component.get(target, -1)}


def test_no_two_rooms_of_streams_import_each_other_directly_or_through_a_cycle() -> None:
    graph = room_imports()
    cycles = sorted(cycle_edges(graph))
    assert not cycles, "imports that close a cycle between rooms of streams/:\n" + "\n".join(
        f"  {source} -> {target} ({', '.join(sorted(graph[source][target]))})" for source, target in cycles)


def test_cycle_finder_sees_cycles_through_several_rooms() -> None:
    graph = {"a": {"b": {"m"}}, "b": {"c": {"m"}}, "c": {"a": {"m"}, "d": {"m"}}, "d": {}}
    assert cycle_edges(graph) == {("a", "b"), ("b", "c"), ("c", "a")}


def test_command_line_code_lives_under_streams_commands() -> None:
    stray = sorted(str(path.relative_to(STREAMS.parent)) for path in STREAMS.rglob("*cli.py")
                   if path != STREAMS / "cli.py" and STREAMS / "commands" not in path.parents)
    assert not stray, f"command-line modules outside streams/commands/: {stray}"


def test_root_of_streams_holds_only_packages_and_the_entry_point() -> None:
    loose = sorted(path.stem for path in STREAMS.glob("*.py") if path.stem not in ROOT_MODULES)
    assert not loose, f"modules at the root of streams/ (give each a package): {loose}"


def test_a_module_that_starts_a_stack_of_its_own_lives_in_tests_stacks() -> None:
    # (tests/cluster starts its stacks on the three-node cluster: the cluster is what decides its tier.)
    tests = STREAMS.parent / "tests"
    starts_one = re.compile(r"\b(running_stack|Fleet)\(")
    misplaced = sorted(str(path.relative_to(tests.parent)) for tier in ("unit", "integration")
                       for path in (tests / tier).rglob("test_*.py") if starts_one.search(path.read_text("utf-8")))
    assert not misplaced, f"modules that start a stack of their own belong in tests/stacks: {misplaced}"
    assert all(starts_one.search(p.read_text("utf-8")) for p in (tests / "stacks").glob("test_*.py"))
