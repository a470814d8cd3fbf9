"""Dispatch a file to its extractor, and what every extractor returns or raises."""
from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath

from schemas.documents import IngestErrorCode


class ParseError(Exception):
    """Why a file yields no chunks, as OpenAI's ``last_error``: a code and a message naming the problem."""

    def __init__(self, code: IngestErrorCode, message: str) -> None:
        super().__init__(message)
        self.code: IngestErrorCode = code
        self.message = message


@dataclass(frozen=True)
class Extracted:
    text: str
    page_starts: tuple[int, ...] = ()  # offset in text where each page begins; empty: not a paged format

    def page_at(self, offset: int) -> int | None:
        """The 1-based page of the character at ``offset``; None without pages."""
        if not self.page_starts:
            return None
        return max(1, bisect.bisect_right(self.page_starts, offset))


def _pdf(data: bytes) -> Extracted:
    from streams.rag.parsing.pdf import extract_pdf

    return extract_pdf(data)


def _docx(data: bytes) -> Extracted:
    from streams.rag.parsing.docx import extract_docx

    return extract_docx(data)


def _html(data: bytes) -> Extracted:
    from streams.rag.parsing.html import extract_html

    return extract_html(data)


def _text(data: bytes) -> Extracted:
    from streams.rag.parsing.text import extract_text

    return extract_text(data)


# By extension; the imports are deferred so a parser loads only the libraries of the types it meets.
EXTRACTORS: dict[str, Callable[[bytes], Extracted]] = {
    ".pdf": _pdf, ".docx": _docx, ".html": _html, ".htm": _html,
    ".md": _text, ".markdown": _text, ".txt": _text, ".text": _text,
}
SUPPORTED = tuple(EXTRACTORS)


def _sniff(data: bytes) -> str | None:
    """A type for a file without an extension, from its first bytes."""
    head = data[:512].lstrip().lower()
    if head.startswith(b"%pdf-"):
        return ".pdf"
    if head.startswith((b"<!doctype html", b"<html")):
        return ".html"
    return None


def extract(data: bytes, filename: str) -> Extracted:
    """The text of a file; ParseError when its type is not supported, it is empty, or it has no text."""
    suffix = PurePosixPath(filename).suffix.lower()
    if suffix not in EXTRACTORS and not suffix:
        suffix = _sniff(data) or suffix
    extractor = EXTRACTORS.get(suffix)
    if extractor is None:
        kind = f"'{suffix}'" if suffix else "without an extension"
        raise ParseError("unsupported_file", f"files {kind} are not supported ({filename}); supported: "
                         f"{', '.join(SUPPORTED)}")
    if not data:
        raise ParseError("invalid_file", f"{filename} is empty")
    extracted = extractor(data)
    if not extracted.text.strip():
        raise ParseError("invalid_file", f"{filename} has no extractable text"
                         + (" (a scanned PDF needs OCR, which is not done)" if suffix == ".pdf" else ""))
    return extracted
