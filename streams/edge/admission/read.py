"""Stage 1, read: the bytes of an HTTP body or a websocket frame, refusing oversized ones before they are parsed.

An HTTP body whose ``Content-Length`` is over ``edge.max_body_bytes``, or
that grows past it while read, is 413 ``request_too_large`` (nothing more of
it is read); a websocket frame over ``edge.max_ws_frame_bytes`` is
:class:`FrameTooLarge`, which closes the socket with 1009.
"""
from __future__ import annotations

from typing import Any

from fastapi import Request

from streams.wire import errors


class FrameTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"frame over {limit} bytes")


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing (413) one larger than ``limit`` bytes without reading it all."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise errors.body_too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise errors.body_too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def read_frame(message: dict[str, Any], limit: int) -> str | bytes:
    """A websocket receive message's payload (text or binary); FrameTooLarge over ``limit`` bytes."""
    raw = message.get("text")
    if raw is None:
        raw = message.get("bytes") or b""
    # A text frame's size on the wire is its UTF-8 length; surrogatepass so an invalid one is measured, not refused.
    size = len(raw) if isinstance(raw, bytes) else len(raw.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise FrameTooLarge(limit)
    return raw
