"""The access log (logger ``streams.edge.access``): one line per request, never a key or a prompt.

An admitted request's line is written when it ends
(:meth:`streams.edge.admission.admit.Ticket.finish`)::

    request_id=chatcmpl-... tenant=alice key_id=3f9a1c2e api=chat status=200 stream=true body_bytes=311
    prompt_sha256=4f0c2b9e1d7a3a55 prompt_chars=120 prompt_tokens=41 max_tokens=64
    completion_tokens=64 finish=length ttft_ms=180 total_ms=2210

a refused one's at once (:func:`refused`: status, code, param, tenant when
known). A prompt is identified by its hash and sizes only, and the Kafka
client's DEBUG records that carry whole messages are dropped
(:func:`keep_payloads_out_of_logs`).
"""
from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from schemas.events import GenerateRequest
from streams.edge.keys import Principal
from streams.wire import errors

access_log = logging.getLogger("streams.edge.access")

# aiokafka logs whole messages at DEBUG ("Sending (key=... value=...)", the produce and fetch requests with their
# record bytes): prompts and completions. The edge drops those loggers' DEBUG records, so that even a DEBUG log
# level never writes a prompt. Their INFO and above (connection trouble) still come through.
_PAYLOAD_LOGGERS = ("aiokafka.producer.producer", "aiokafka.conn", "aiokafka.consumer.fetcher")


class _DropDebug(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.DEBUG


def keep_payloads_out_of_logs() -> None:
    """Idempotent; called when an edge app is created."""
    for name in _PAYLOAD_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropDebug) for f in logger.filters):
            logger.addFilter(_DropDebug())


def prompt_hash(request: GenerateRequest) -> str:
    """A short digest of the prompt for logs (which never carry the prompt itself)."""
    if request.messages is not None:
        material = json.dumps([[m.role, m.content] for m in request.messages], ensure_ascii=False)
    elif request.prompt is None and request.prompt_token_ids is not None:  # token ids the edge could not decode
        material = json.dumps(request.prompt_token_ids)
    else:
        material = request.prompt or ""
    return hashlib.sha256(material.encode("utf-8")).hexdigest()[:16]


def prompt_chars(request: GenerateRequest) -> int:
    if request.messages is not None:
        return sum(len(m.content) for m in request.messages)
    return len(request.prompt or "")


def line(**values: Any) -> None:
    """One access-log line of ``key=value`` fields, leaving out those that are None."""
    access_log.info(" ".join(f"{k}={v}" for k, v in values.items() if v is not None))


def refused(exc: errors.EdgeError, *, api: str, principal: Principal | None = None, body_bytes: int | None = None,
            request: GenerateRequest | None = None) -> None:
    """The line of a request refused before admission."""
    line(request_id=request.request_id if request is not None else "-",
         tenant=principal.tenant if principal is not None else "-", api=api, status=exc.status,
         code=exc.code or exc.type, param=exc.param, body_bytes=body_bytes,
         prompt_sha256=prompt_hash(request) if request is not None else None)
