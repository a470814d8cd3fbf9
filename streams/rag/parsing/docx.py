"""DOCX: the body's paragraphs and tables in document order (python-docx), one paragraph per line."""
from __future__ import annotations

import io
import zipfile

from streams.rag.parsing.extract import Extracted, ParseError


def extract_docx(data: bytes) -> Extracted:
    import docx
    from docx.opc.exceptions import PackageNotFoundError
    from docx.table import Table

    try:
        document = docx.Document(io.BytesIO(data))
        lines: list[str] = []
        for block in document.iter_inner_content():
            if isinstance(block, Table):
                lines += [" | ".join(cell.text for cell in row.cells) for row in block.rows]
            else:
                lines.append(block.text)
    except (PackageNotFoundError, zipfile.BadZipFile, KeyError, ValueError) as error:
        raise ParseError("invalid_file", f"the DOCX is corrupt (not a Word document package): {error}") from None
    return Extracted("\n".join(lines))
