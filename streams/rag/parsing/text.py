"""Plain text and Markdown: decoded as UTF-8 (a byte-order mark picks UTF-16 or UTF-8), line ends unified.

Markdown stays as written: its markup is little noise to an embedding, and the text a chunk cites is the
file's own.
"""
from __future__ import annotations

import codecs

from streams.rag.parsing.extract import Extracted, ParseError

_BOMS = ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


def decode_text(data: bytes, what: str = "text") -> str:
    encoding = next((name for bom, name in _BOMS if data.startswith(bom)), "utf-8")
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as error:
        raise ParseError("invalid_file", f"the {what} is not valid {encoding.upper().removesuffix('-SIG')}: "
                         f"byte {error.start} ({data[error.start:error.start + 1]!r})") from None
    if "\x00" in text:
        raise ParseError("invalid_file", f"the {what} contains NUL characters: a binary file, not text")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def extract_text(data: bytes) -> Extracted:
    return Extracted(decode_text(data))
