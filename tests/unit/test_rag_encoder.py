"""The embedding model's tokenizer and encoder (streams/rag/minilm.py) give transformers' token ids and BertModel's
states bit for bit, without importing transformers."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from streams.rag.embedding import MAX_TOKENS, model_dir
from streams.rag.minilm import BertShape, MiniLM
from tests.import_checks import COMPILER_MODULES, loaded_after
from tests.rag_support import shared_embedder

TEXTS = [
    "hello world",
    "Kafka keeps each partition's records in order; consumers in a group share the partitions.",
    "The spare turbine for the Oskarsund dam is stored in warehouse nineteen. " * 30,  # past the 256-token window
]


@pytest.fixture(scope="module")
def models() -> tuple[MiniLM, torch.nn.Module, object]:
    folder = model_dir()
    return MiniLM.load(folder), AutoModel.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)


@pytest.mark.parametrize("texts", [TEXTS, TEXTS[:1]], ids=["padded batch", "one text, no padding"])
def test_the_last_hidden_states_equal_transformers_bert_bit_for_bit(models: tuple, texts: list[str]) -> None:
    ours, theirs, tokenizer = models
    encoded = tokenizer(texts, padding=True, truncation=True, max_length=MAX_TOKENS, return_tensors="pt")
    with torch.inference_mode():
        expected = theirs(**encoded).last_hidden_state
        got = ours(encoded["input_ids"], encoded["attention_mask"])
    real = encoded["attention_mask"].bool()  # padding positions are never pooled
    assert got.shape == expected.shape
    assert torch.equal(got[real], expected[real])


def test_the_embedders_token_ids_equal_transformers_tokenizer(models: tuple) -> None:
    _, _, tokenizer = models
    texts = [*TEXTS, "Ünïcödé, accents and CJK: 東京 — tabs\tand\nnewlines", "", "   "]
    embedder = shared_embedder()
    ours = [encoding.ids for encoding in embedder.tokenizer.encode_batch(texts, add_special_tokens=False)]
    assert ours == tokenizer(texts, add_special_tokens=False, truncation=False)["input_ids"]
    assert (embedder.cls_id, embedder.sep_id, embedder.pad_id) == (
        tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id)


def test_a_config_that_is_not_bert_with_gelu_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "roberta", "hidden_act": "gelu"}')
    with pytest.raises(ValueError, match="not a BERT encoder"):
        BertShape.from_config(tmp_path / "config.json")


def test_loading_the_embedder_imports_neither_transformers_nor_torch_compile_machinery() -> None:
    """transformers' BERT modeling code imports torch._dynamo (~2.5 s of every rag start on 2 cores); transformers
    itself takes ~1 s more."""
    code = "from streams.rag.embedding import Embedder\nEmbedder().embed(['hello'])"
    assert loaded_after(code, (*COMPILER_MODULES, "transformers")) == []
