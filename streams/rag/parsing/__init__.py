"""Text out of a file's bytes, by type, and chunks out of the text: the parser's pure part (no Kafka, no network).

:func:`extract` picks the extractor by the file name's extension (or, without one, by its first bytes) and
returns :class:`Extracted`: the text and where each page starts in it. Every problem is a :class:`ParseError`
with OpenAI's ``last_error`` code and a precise message.
"""
from streams.rag.parsing.extract import SUPPORTED, Extracted, ParseError, extract

__all__ = ["SUPPORTED", "Extracted", "ParseError", "extract"]
