"""Every relative link in the README and docs/ leads somewhere: the file exists, and a #fragment names a heading
of the page it points to (GitHub's anchors). Links inside code blocks and to other sites are not checked."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "bench").rglob("README.md"),
                *(REPO / "infra").rglob("README.md")])
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def prose(text: str, *, inline_code: bool = False) -> str:
    """The page without its fenced code blocks (their brackets are code, not links), and without inline code
    unless asked (a heading's anchor keeps its words)."""
    kept, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
        elif not fenced:
            kept.append(line if inline_code else re.sub(r"`[^`]*`", "", line))
    return "\n".join(kept)


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens, repeats numbered."""
    seen: dict[str, int] = {}
    out = set()
    for line in prose(page.read_text(), inline_code=True).splitlines() if page.suffix == ".md" else ():
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).lower()).replace(" ", "-")
        out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return out


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        if not destination.exists():
            broken.append(f"{target}: no such file")
        elif fragment and fragment not in anchors(destination):
            broken.append(f"{target}: no heading #{fragment} in {destination.name}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_names_an_existing_file_and_heading(page: Path) -> None:
    assert broken_links(page) == []


def test_a_missing_file_and_a_missing_heading_are_reported(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## A section: with `code`\n\n## A section: with `code`\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md#a-section-with-code-1) [gone](missing.md) [bad](other.md#nope)\n"
                    "```\n[in code](missing.md)\n```\n[site](https://example.com/x)\n")
    assert broken_links(page) == ["missing.md: no such file", "other.md#nope: no heading #nope in other.md"]
