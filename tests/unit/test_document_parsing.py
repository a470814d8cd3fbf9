"""The parser's pure part: text by type (PDF with pages, DOCX, HTML without boilerplate, Markdown, text), precise
failures, and chunks whose character spans are exactly their text (all-MiniLM-L6-v2's tokenizer, offline)."""
from __future__ import annotations

import itertools
import time

import pytest

from schemas.documents import IngestJob, StaticChunking
from streams.rag.parser import chunk_parts
from streams.rag.parsing import Extracted, ParseError, extract
from streams.rag.parsing.chunking import Chunker
from streams.rag.tokenizer import model_dir
from tests import document_files
from tests.import_checks import COMPILER_MODULES, loaded_after


@pytest.fixture(scope="module")
def chunker() -> Chunker:
    return Chunker.load()


def test_a_pdf_keeps_its_pages_and_where_each_starts() -> None:
    extracted = extract(document_files.pdf(["First page text", "Second page (two)"]), "report.pdf")
    assert "First page text" in extracted.text and "Second page (two)" in extracted.text
    second = extracted.text.index("Second")
    assert extracted.page_at(0) == 1 and extracted.page_at(second) == 2 and len(extracted.page_starts) == 2


def test_an_encrypted_pdf_fails_as_encrypted() -> None:
    with pytest.raises(ParseError) as caught:
        extract(document_files.encrypted_pdf(["secret text"]), "locked.pdf")
    assert caught.value.code == "invalid_file" and "encrypted" in caught.value.message


@pytest.mark.parametrize("data", [b"%PDF-1.4\nthis is not a pdf at all", document_files.pdf(["x"])[:60]])
def test_a_corrupt_pdf_fails_as_corrupt(data: bytes) -> None:
    with pytest.raises(ParseError) as caught:
        extract(data, "broken.pdf")
    assert caught.value.code == "invalid_file" and "corrupt" in caught.value.message


def test_a_pdf_without_text_says_so() -> None:
    with pytest.raises(ParseError) as caught:
        extract(document_files.pdf([""]), "scan.pdf")
    assert caught.value.code == "invalid_file" and "no extractable text" in caught.value.message


def test_a_docx_gives_its_paragraphs_and_tables_in_order() -> None:
    data = document_files.docx(["Introduction", "Kafka stores logs."], table=[["key", "value"], ["a", "1"]])
    assert extract(data, "notes.docx").text == "Introduction\nKafka stores logs.\nkey | value\na | 1"


def test_a_corrupt_docx_fails_naming_it() -> None:
    with pytest.raises(ParseError) as caught:
        extract(b"PK\x03\x04 not really a zip", "notes.docx")
    assert caught.value.code == "invalid_file" and "DOCX" in caught.value.message


def test_html_keeps_the_content_and_drops_navigation_footer_scripts_and_styles() -> None:
    text = extract(document_files.HTML_WITH_BOILERPLATE, "page.html").text
    assert text == ("Partitions\nA topic is split into partitions, each an ordered log.\n"
                    "Consumers in a group share the partitions.")


def test_markdown_and_text_are_decoded_with_unified_line_ends() -> None:
    assert extract(b"# Title\r\n\r\nBody\r\n", "README.md").text == "# Title\n\nBody\n"
    assert extract("\ufeffcaf\u00e9".encode("utf-8"), "a.txt").text == "caf\u00e9"
    with pytest.raises(ParseError, match="not valid UTF-8: byte 1"):
        extract(b"a\xffb", "a.txt")


@pytest.mark.parametrize("data, filename, code, words", [
    (b"x", "image.png", "unsupported_file", "'.png' are not supported"),
    (b"", "empty.txt", "invalid_file", "empty"),
    (b"   \n\n  ", "blank.md", "invalid_file", "no extractable text"),
    (b"\x00\x01binary", "data.txt", "invalid_file", "binary"),
])
def test_unsupported_empty_and_textless_files_fail_precisely(data: bytes, filename: str, code: str,
                                                             words: str) -> None:
    with pytest.raises(ParseError) as caught:
        extract(data, filename)
    assert caught.value.code == code and words in caught.value.message


def test_a_file_without_extension_is_recognised_by_its_first_bytes() -> None:
    assert "Hello" in extract(document_files.pdf(["Hello"]), "download").text


def test_every_chunk_is_exactly_its_span_of_the_text_and_windows_overlap(chunker: Chunker) -> None:
    text = " ".join(f"Sentence number {i} talks about Kafka partitions, offsets and consumer groups." for i in
                    range(300))
    strategy = StaticChunking(max_chunk_size_tokens=100, chunk_overlap_tokens=30)
    chunks = chunker.chunks(Extracted(text), strategy)
    assert [c.index for c in chunks] == list(range(len(chunks))) and len(chunks) > 10
    for chunk in chunks:
        assert text[chunk.char_start:chunk.char_end] == chunk.text
        assert chunk.tokens <= 100 and chunk.page is None
    assert all(c.tokens == 100 for c in chunks[:-1])
    assert all(b.char_start < a.char_end for a, b in itertools.pairwise(chunks))  # consecutive windows share text
    assert chunks[-1].char_end == len(text.rstrip(".")) + 1
    assert chunker.chunks(Extracted(text), strategy) == chunks  # the same text gives the same chunks


def test_token_spans_equal_transformers_offsets(chunker: Chunker) -> None:
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(str(model_dir()), local_files_only=True)
    reference.model_max_length = 1 << 40
    texts = ["Kafka partitions, offsets and consumer groups.", "Ünïcödé, accents and CJK: 東京 — tabs\tand\nnewlines",
             "", "   ", "x" * 3000, " ".join(f"word{i}" for i in range(2000))]
    for text in texts:
        offsets = reference(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        assert chunker.spans(text) == [(start, end) for start, end in offsets if end > start], text[:40]


def test_the_parser_imports_neither_transformers_nor_torch() -> None:
    """The parser only needs the tokenizer's offsets: transformers (and torch under it) cost 2-5 s of its start."""
    code = "import streams.rag.parser\nfrom streams.rag.parsing.chunking import Chunker\nChunker.load()"
    assert loaded_after(code, (*COMPILER_MODULES, "transformers", "torch")) == []


def test_chunks_of_a_pdf_name_the_page_they_start_on(chunker: Chunker) -> None:
    pages = [" ".join(f"page{p} word{i}" for i in range(80)) for p in (1, 2, 3)]
    extracted = extract(document_files.pdf(pages), "book.pdf")
    chunks = chunker.chunks(extracted, StaticChunking(max_chunk_size_tokens=100, chunk_overlap_tokens=0))
    for chunk in chunks:
        assert extracted.text[chunk.char_start:chunk.char_end] == chunk.text
        assert chunk.page == extracted.page_at(chunk.char_start)
    assert {c.page for c in chunks} == {1, 2, 3}


def test_large_documents_travel_in_size_bounded_parts_that_count_every_chunk(chunker: Chunker) -> None:
    text = "word " * 20_000
    chunks = chunker.chunks(Extracted(text), StaticChunking(max_chunk_size_tokens=200, chunk_overlap_tokens=0))
    job = IngestJob(job_id="j", vector_store_id="vs_1", file_id="file-a", tenant="t", filename="a.txt",
                    blob_key="ab/file-a", sha256="0" * 64, bytes=len(text), created_at=time.time())
    parts = chunk_parts(job, chunks, part_bytes=16 * 1024)
    assert len(parts) > 2 and all(p.parts == len(parts) and p.total_chunks == len(chunks) for p in parts)
    assert [c.index for p in parts for c in p.chunks] == list(range(len(chunks)))
    assert all(len(p.model_dump_json()) < 16 * 1024 + 2048 for p in parts)
