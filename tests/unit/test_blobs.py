"""The blob store: atomic writes, checksums checked on every read, keys that cannot leave its folder."""
from __future__ import annotations

import io

import pytest

from streams.files.blobs import BlobMissing, BlobStore, ChecksumMismatch, TooLarge


def test_a_blob_reads_back_with_its_checksum_and_leaves_no_temporary_file(tmp_path) -> None:
    store = BlobStore(tmp_path)
    ref = store.put("file-a", io.BytesIO(b"hello"))
    assert store.read(ref.key, ref.sha256) == b"hello" and ref.size == 5
    assert store.verified_path(ref.key, ref.sha256).read_bytes() == b"hello"
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == ["file-a"]


def test_changed_bytes_are_a_checksum_mismatch_and_a_missing_blob_says_so(tmp_path) -> None:
    store = BlobStore(tmp_path)
    ref = store.put("file-a", io.BytesIO(b"hello"))
    store.path(ref.key).write_bytes(b"hellO")
    with pytest.raises(ChecksumMismatch, match="expected"):
        store.read(ref.key, ref.sha256)
    store.delete(ref.key)
    with pytest.raises(BlobMissing):
        store.verified_path(ref.key, ref.sha256)


def test_past_the_limit_nothing_is_kept(tmp_path) -> None:
    store = BlobStore(tmp_path)
    with pytest.raises(TooLarge):
        store.put_chunks("file-big", [b"x" * 10, b"x" * 10], limit=15)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


@pytest.mark.parametrize("key", ["../etc/passwd", "ab/../../x", "/abs/file-a", "ab/file-a/../b"])
def test_a_key_from_a_message_cannot_point_outside_the_folder(tmp_path, key: str) -> None:
    with pytest.raises(BlobMissing):
        BlobStore(tmp_path).read(key, "0" * 64)
