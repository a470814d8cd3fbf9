"""PDF: each page's text (pypdf, pure Python, nothing downloaded), pages separated by a blank line.

An encrypted PDF whose user password is empty (only its permissions are protected) opens like any other; one
that needs a password fails as encrypted. A file pypdf cannot read fails as corrupt, with pypdf's reason.
"""
from __future__ import annotations

import io
import logging

from streams.rag.parsing.extract import Extracted, ParseError

PAGE_SEPARATOR = "\n\n"


def extract_pdf(data: bytes) -> Extracted:
    from pypdf import PdfReader
    from pypdf.errors import PyPdfError

    # pypdf logs every recoverable flaw of a file as a warning: one per page of a sloppy PDF is noise here.
    logging.getLogger("pypdf").setLevel(logging.ERROR)
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise ParseError("invalid_file", "the PDF is encrypted (password-protected); upload it unencrypted")
        texts = [page.extract_text() or "" for page in reader.pages]
    except ParseError:
        raise
    except PyPdfError as error:
        if "decrypt" in str(error).lower() or "password" in str(error).lower():
            raise ParseError("invalid_file", f"the PDF is encrypted and cannot be read: {error}") from None
        raise ParseError("invalid_file", f"the PDF is corrupt: {error}") from None
    except (ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError) as error:
        # pypdf lets some malformed structures surface as plain Python errors.
        raise ParseError("invalid_file", f"the PDF is corrupt: {type(error).__name__}: {error}") from None
    starts, offset = [], 0
    for text in texts:
        starts.append(offset)
        offset += len(text) + len(PAGE_SEPARATOR)
    return Extracted(PAGE_SEPARATOR.join(texts), tuple(starts))
