"""Token windows over the extracted text, with the embedding model's tokenizer (OpenAI's static strategy).

Chunk ``i`` holds tokens ``[i * step, i * step + max_chunk_size_tokens)`` with ``step = max - overlap``; its
text is the extracted text between its first token's start and its last token's end, so
``text[char_start:char_end] == chunk.text`` always holds. The same text and strategy give the same chunks
(indices, spans, text): a redelivered job republishes identical ones.

The tokenizer is all-MiniLM-L6-v2's (streams/rag/tokenizer.py), read offline from the package's folder.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from schemas.documents import Chunk, StaticChunking
from streams.rag.parsing.extract import Extracted
from streams.rag.tokenizer import load_tokenizer


@dataclass
class Chunker:
    """Cuts text into token windows; safe to share between threads (encoding does not change the tokenizer)."""

    tokenizer: Tokenizer

    @classmethod
    def load(cls, folder: Path | None = None) -> Chunker:
        return cls(load_tokenizer(folder))

    def spans(self, text: str) -> list[tuple[int, int]]:
        """Each token's (start, end) character span in ``text``, special tokens left out."""
        return [(start, end) for start, end in self.tokenizer.encode(text, add_special_tokens=False).offsets
                if end > start]

    def chunks(self, extracted: Extracted, strategy: StaticChunking) -> list[Chunk]:
        text = extracted.text
        spans = self.spans(text)
        size = strategy.max_chunk_size_tokens
        step = size - strategy.chunk_overlap_tokens
        chunks: list[Chunk] = []
        for first in range(0, len(spans), step):
            window = spans[first:first + size]
            start, end = window[0][0], window[-1][1]
            chunks.append(Chunk(index=len(chunks), text=text[start:end], char_start=start, char_end=end,
                                page=extracted.page_at(start), tokens=len(window)))
            if first + size >= len(spans):
                break
        return chunks
