"""OpenAI's Files API on the edge: upload, list, retrieve, delete and download files (:mod:`streams.files`).

``POST /v1/files`` takes OpenAI's multipart form (``file``, ``purpose``, optionally ``expires_after[anchor]``
and ``expires_after[seconds]``); the upload may be as large as ``files.max_bytes`` (not ``edge.max_body_bytes``,
which bounds JSON bodies) and is cut off with 413 as soon as it passes it. A tenant sees only its own files;
another tenant's file id is as unknown as a made-up one (404).
"""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import FileResponse
from starlette.datastructures import FormData, UploadFile
from starlette.types import Message

from streams.edge import files_openapi as doc
from streams.edge.keys import Principal
from streams.edge.openai_api import principal
from streams.files.blobs import BlobError, TooLarge
from streams.files.purposes import InvalidFile, check_upload_purpose
from streams.files.store import FileStore, FilesUnavailable, NoSuchFile
from streams.wire.errors import EdgeError, not_ready

router = APIRouter()
# Room for the multipart framing and the small fields around the file itself.
FORM_OVERHEAD_BYTES = 64 * 1024
LIST_QUERY = frozenset(p["name"] for p in doc.LIST_PARAMETERS["parameters"])


def _store(request: Request) -> FileStore:
    store: FileStore | None = getattr(request.app.state.edge, "files", None)
    if store is None or not request.app.state.edge.connected.is_set():
        raise not_ready("the files store is not connected to Kafka yet")
    return store


def file_not_found(file_id: str) -> EdgeError:
    return EdgeError(404, f"No such File object: {file_id}", param="id")


def file_too_large(limit: int) -> EdgeError:
    return EdgeError(413, f"The file is larger than the limit of {limit} bytes (files.max_bytes).",
                     param="file", code="file_too_large")


def _invalid(param: str, message: str, code: str = "invalid_value") -> EdgeError:
    return EdgeError(400, message, param=param, code=code)


@router.post("/v1/files", response_model=doc.OpenAIFile, responses=doc.UPLOAD_RESPONSES,
             openapi_extra=doc.UPLOAD_BODY)
async def create_file(request: Request, caller: Principal = Depends(principal)) -> dict[str, Any]:
    """Upload a file (multipart: `file`, `purpose`)."""
    store = _store(request)
    form = await _read_form(request, store.max_bytes)
    try:
        upload, purpose, expires_after_s = _upload_fields(form)
        try:
            file = await store.create(tenant=caller.tenant, filename=upload.filename or "upload", purpose=purpose,
                                      source=upload.file, expires_after_s=expires_after_s)
        except TooLarge as error:
            raise file_too_large(error.limit) from None
        except InvalidFile as error:
            raise _invalid(error.param, error.message, "invalid_file") from None
        except FilesUnavailable as error:
            raise not_ready(str(error)) from None
    finally:
        await form.close()
    return file.openai()


async def _read_form(request: Request, max_bytes: int) -> FormData:
    """The multipart form, read with the body cut off (413) as soon as it passes the file limit."""
    limit = max_bytes + FORM_OVERHEAD_BYTES
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise file_too_large(max_bytes)
    received = 0

    async def receive() -> Message:
        nonlocal received
        message = await request.receive()
        received += len(message.get("body", b""))
        if received > limit:
            raise file_too_large(max_bytes)
        return message

    bounded = Request(request.scope, receive)
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise _invalid("file", "The body must be multipart/form-data with the fields `file` and `purpose`.")
    return await bounded.form(max_files=1, max_fields=8)


def _upload_fields(form: FormData) -> tuple[UploadFile, str, int | None]:
    upload, purpose = form.get("file"), form.get("purpose")
    if not isinstance(upload, UploadFile):
        raise _invalid("file", "Missing required parameter: 'file' (a file part of the multipart form).",
                       "missing_required_parameter")
    if not isinstance(purpose, str) or not purpose:
        raise _invalid("purpose", "Missing required parameter: 'purpose'.", "missing_required_parameter")
    problem = check_upload_purpose(purpose)
    if problem is not None:
        raise _invalid("purpose", problem)
    return upload, purpose, _expires_after(form)


def _expires_after(form: FormData) -> int | None:
    anchor, seconds = form.get("expires_after[anchor]"), form.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return None
    if anchor != "created_at":
        raise _invalid("expires_after.anchor", "Invalid value for 'expires_after.anchor': must be 'created_at'.")
    low, high = doc.EXPIRY_BOUNDS_S
    if not isinstance(seconds, str) or not seconds.isdigit() or not low <= int(seconds) <= high:
        raise _invalid("expires_after.seconds",
                       f"Invalid value for 'expires_after.seconds': an integer from {low} to {high}.")
    return int(seconds)


@router.get("/v1/files", response_model=doc.OpenAIFileList, responses=doc.LIST_RESPONSES,
            openapi_extra=doc.LIST_PARAMETERS)
async def list_files(request: Request, caller: Principal = Depends(principal)) -> dict[str, Any]:
    """The caller's files, newest first by default (OpenAI's cursor page: `after`, `limit`, `order`)."""
    query = request.query_params
    unknown = sorted(set(query) - LIST_QUERY)
    if unknown:
        raise _invalid(unknown[0], f"Unrecognized request argument supplied: {unknown[0]!r}", "unknown_parameter")
    purpose, order, after = query.get("purpose"), query.get("order"), query.get("after")
    count = _limit(query.get("limit"))
    if order not in (None, "asc", "desc"):
        raise _invalid("order", f"Invalid value for 'order': {order!r}. Supported values are: 'asc' and 'desc'.")
    try:
        page = await _store(request).list(caller.tenant, purpose=purpose, order=order or "desc", after=after,
                                          limit=count)
    except FilesUnavailable as error:
        raise not_ready(str(error)) from None
    data = [f.openai() for f in page.files]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": page.has_more}


def _limit(raw: str | None) -> int:
    if raw is None:
        return doc.MAX_LIST_LIMIT
    if not raw.isdigit() or not 1 <= int(raw) <= doc.MAX_LIST_LIMIT:
        raise _invalid("limit", f"Invalid value for 'limit': {raw!r}. An integer from 1 to {doc.MAX_LIST_LIMIT}.")
    return int(raw)


@router.get("/v1/files/{file_id}", response_model=doc.OpenAIFile, responses=doc.ONE_FILE_RESPONSES)
async def retrieve_file(file_id: str, request: Request, caller: Principal = Depends(principal)) -> dict[str, Any]:
    """One file's object."""
    return (await _get(request, caller, file_id)).openai()


@router.delete("/v1/files/{file_id}", response_model=doc.OpenAIFileDeleted,
               responses=doc.ONE_FILE_RESPONSES)
async def delete_file(file_id: str, request: Request, caller: Principal = Depends(principal)) -> dict[str, Any]:
    """Delete a file: its object and its bytes."""
    try:
        await _store(request).delete(caller.tenant, file_id)
    except NoSuchFile:
        raise file_not_found(file_id) from None
    except FilesUnavailable as error:
        raise not_ready(str(error)) from None
    return {"id": file_id, "object": "file", "deleted": True}


@router.get("/v1/files/{file_id}/content", response_model=None, response_class=FileResponse,
            responses=doc.CONTENT_RESPONSES)
async def file_content(file_id: str, request: Request, caller: Principal = Depends(principal)) -> FileResponse:
    """The file's bytes, checked against the SHA-256 taken at upload."""
    file = await _get(request, caller, file_id)
    try:
        path = await _store(request).content_path(caller.tenant, file_id)
    except BlobError as error:
        raise EdgeError(500, f"The content of {file_id} cannot be served: {error}", type="server_error",
                        code="server_error") from None
    return FileResponse(path, media_type="application/octet-stream", filename=file.filename)


async def _get(request: Request, caller: Principal, file_id: str) -> Any:
    try:
        return await _store(request).get(caller.tenant, file_id)
    except NoSuchFile:
        raise file_not_found(file_id) from None
    except FilesUnavailable as error:
        raise not_ready(str(error)) from None
