"""Generated tables written into the docs in place: ``config reference --write docs/configuration.md`` and
``topics markdown --write docs/topics.md`` replace the table whose header row is the generated one's, so the page
keeps its prose around it and the table cannot drift from the code (tests/unit/test_config.py checks both pages)."""
from __future__ import annotations

from pathlib import Path

from streams.commands.common import EXIT_CONFIG, say


def replace_table(page: str, table: str) -> str:
    """``page`` with the markdown table that starts with ``table``'s header row replaced by ``table``."""
    lines = page.split("\n")
    header = table.split("\n", 1)[0]
    if header not in lines:
        raise ValueError(f"no table with the header row {header!r} to replace")
    start = end = lines.index(header)
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return "\n".join([*lines[:start], table, *lines[end:]])


def write_table(path: Path, table: str) -> int:
    try:
        text = path.read_text()
        updated = replace_table(text, table)
    except (OSError, ValueError) as error:
        say(f"{path}: {error}")
        return EXIT_CONFIG
    if updated == text:
        say(f"{path}: the table is current")
    else:
        path.write_text(updated)
        say(f"{path}: table rewritten")
    return 0
