"""How the Files API (:mod:`streams.edge.files_api`) appears in the edge's OpenAPI document.

Its routes read the multipart form and the query by hand (precise OpenAI-shaped errors, the size limit
enforced while the body streams in), so FastAPI cannot infer them: the request body, the list's query
parameters and every response are declared here, with OpenAI's shapes.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from schemas.documents import UPLOAD_PURPOSES
from streams.edge.openapi import AUTH_ERRORS
from streams.wire.api_models import ErrorResponse

MAX_LIST_LIMIT = 10_000
# OpenAI's bounds of expires_after[seconds]: an hour to 30 days.
EXPIRY_BOUNDS_S = (3600, 2_592_000)


class OpenAIFile(BaseModel):
    """OpenAI's file object."""

    id: str = Field(description="The file's id, `file-…`.")
    object: Literal["file"]
    bytes: int = Field(description="Size in bytes.")
    created_at: int = Field(description="Unix time (seconds) of the upload.")
    filename: str
    purpose: str = Field(description="What the file is for.")
    status: Literal["uploaded", "processed", "error"] = Field(description="Deprecated by OpenAI; always processed.")
    status_details: str | None
    expires_at: int | None = Field(description="Unix time it expires; null: never.")


class OpenAIFileList(BaseModel):
    object: Literal["list"]
    data: list[OpenAIFile]
    first_id: str | None
    last_id: str | None
    has_more: bool = Field(description="More files follow the last one: pass its id as `after`.")


class OpenAIFileDeleted(BaseModel):
    id: str
    object: Literal["file"]
    deleted: bool


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorResponse, "description": description}


UNAVAILABLE = {503: _error("Kafka is unreachable or the files topic is still being read (service_unavailable).")}
NOT_FOUND = {404: _error("No file with this id belongs to the caller.")}

UPLOAD_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: _error("A missing or invalid field, naming it: file, purpose, expires_after; or the purpose's check "
                "of the content failed (invalid_file)."),
    **AUTH_ERRORS,
    413: _error("The file is larger than files.max_bytes (file_too_large)."),
    **UNAVAILABLE,
}
LIST_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: _error("An invalid query parameter, naming it: limit, order."), **AUTH_ERRORS, **UNAVAILABLE,
}
ONE_FILE_RESPONSES: dict[int | str, dict[str, Any]] = {**AUTH_ERRORS, **NOT_FOUND, **UNAVAILABLE}
CONTENT_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "The file's bytes.",
          "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
    **ONE_FILE_RESPONSES,
    500: _error("The stored bytes no longer match the checksum taken at upload (server_error)."),
}

UPLOAD_BODY: dict[str, Any] = {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
    "type": "object", "required": ["file", "purpose"],
    "properties": {
        "file": {"type": "string", "format": "binary", "description": "The file; its name is kept as filename."},
        "purpose": {"type": "string", "enum": list(UPLOAD_PURPOSES), "description": "What the file is for."},
        "expires_after[anchor]": {"type": "string", "enum": ["created_at"]},
        "expires_after[seconds]": {"type": "integer", "minimum": EXPIRY_BOUNDS_S[0], "maximum": EXPIRY_BOUNDS_S[1],
                                   "description": "Seconds after created_at the file expires."},
    },
}}}}}

LIST_PARAMETERS: dict[str, Any] = {"parameters": [
    {"name": "purpose", "in": "query", "required": False, "schema": {"type": "string"},
     "description": "Only files with this purpose."},
    {"name": "limit", "in": "query", "required": False,
     "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIST_LIMIT, "default": MAX_LIST_LIMIT}},
    {"name": "order", "in": "query", "required": False, "schema": {"type": "string", "enum": ["asc", "desc"],
                                                                   "default": "desc"},
     "description": "By created_at."},
    {"name": "after", "in": "query", "required": False, "schema": {"type": "string"},
     "description": "A file id: list the files after it (the cursor)."},
]}
