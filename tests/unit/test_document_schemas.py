"""The documents contract (docs/retrieval.md): OpenAI's chunking limits, failure states and the file object shape."""
import time

import pytest
from pydantic import ValidationError

from schemas.documents import DocumentState, FileObject, IngestError, IngestJob, StaticChunking

SHA = "0" * 64


def _job(**overrides) -> IngestJob:
    body = {"job_id": "j1", "vector_store_id": "vs_1", "file_id": "file-abc", "tenant": "t", "filename": "a.pdf",
            "blob_key": "ab/file-abc", "sha256": SHA, "bytes": 10, "created_at": time.time()}
    return IngestJob.model_validate({**body, **overrides})


def test_chunking_defaults_are_openais_800_and_400():
    chunking = _job().chunking
    assert (chunking.max_chunk_size_tokens, chunking.chunk_overlap_tokens) == (800, 400)


@pytest.mark.parametrize("body, field", [
    ({"max_chunk_size_tokens": 99}, "max_chunk_size_tokens"),
    ({"max_chunk_size_tokens": 4097}, "max_chunk_size_tokens"),
    ({"max_chunk_size_tokens": 200, "chunk_overlap_tokens": 101}, "chunk_overlap_tokens"),
])
def test_chunking_outside_openais_limits_is_rejected_naming_the_field(body, field):
    with pytest.raises(ValidationError) as err:
        StaticChunking.model_validate(body)
    assert field in str(err.value)


def test_a_failed_state_needs_its_error_and_only_a_failed_one_has_one():
    error = IngestError(code="invalid_file", message="the PDF is encrypted")
    common = {"vector_store_id": "vs_1", "file_id": "file-abc", "tenant": "t", "job": _job(), "updated_at": 1.0}
    DocumentState(status="failed", stage="failed", last_error=error, **common)
    with pytest.raises(ValidationError, match="last_error"):
        DocumentState(status="failed", stage="failed", **common)
    with pytest.raises(ValidationError, match="last_error"):
        DocumentState(status="completed", stage="indexed", last_error=error, **common)


def test_the_file_object_is_openais_without_our_fields():
    file = FileObject(id="file-abc", bytes=3, created_at=1, filename="a.txt", purpose="assistants", tenant="t",
                      blob_key="ab/file-abc", sha256=SHA)
    assert file.openai() == {"id": "file-abc", "object": "file", "bytes": 3, "created_at": 1, "filename": "a.txt",
                             "purpose": "assistants", "status": "processed", "status_details": None,
                             "expires_at": None}
    with pytest.raises(ValidationError, match="id"):
        FileObject.model_validate({**file.model_dump(), "id": "abc"})
