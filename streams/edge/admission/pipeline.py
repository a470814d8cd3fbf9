"""The gate every generation request passes before Kafka, and the access log it leaves.

:class:`Gate` (one per app, ``app.state.gate``) holds the authenticator, the
tokenizers (context check) and the limiter. The HTTP routes and the websocket
both do::

    principal = gate.authenticate(key)                 # 401
    ... parse and validate the body, build the GenerateRequest (tenant = principal.tenant) ...
    ticket = await gate.admit(principal, request, ...)  # 400 context, 429 limits
    try: ... edge.submit(ticket.request), relay events, ticket.saw(chunk) ...
    finally: ticket.finish(status, final_event)

``finish`` returns the concurrency lease and the reserved tokens the request
did not use, and writes one access-log line (logger ``streams.edge.access``):

    request_id=chatcmpl-... tenant=alice api=chat status=200 stream=true body_bytes=311
    prompt_sha256=4f0c2b9e1d7a3a55 prompt_chars=120 prompt_tokens=41 max_tokens=64
    completion_tokens=64 finish=length ttft_ms=180 total_ms=2210

Requests refused before admission get a line too (status, code, tenant when
known). Keys and prompt text never appear in any log line: a prompt is
identified by its hash and sizes only, and the Kafka client's DEBUG records
that carry whole messages are dropped (:func:`keep_payloads_out_of_logs`).
"""
from __future__ import annotations

import logging
import time
from typing import Any

from schemas.events import Completion, ErrorEvent, GenerateRequest, TokenChunk
from streams.edge import errors
from streams.edge.auth import Authenticator
from streams.edge.keys import Principal, TenantLimits
from streams.edge.limits import Lease, Limiter, make_limiter
from streams.edge.settings import EdgeOptions
from streams.edge.validation import TokenCounter, prompt_chars, prompt_hash

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


def _fields(**values: Any) -> str:
    return " ".join(f"{k}={v}" for k, v in values.items() if v is not None)


class Ticket:
    """An admitted request: its lease on the tenant's limits and what the access log needs."""

    def __init__(self, gate: "Gate", principal: Principal, request: GenerateRequest, *, api: str, stream: bool,
                 body_bytes: int | None, prompt_tokens: int | None, lease: Lease | None) -> None:
        self.gate = gate
        self.principal = principal
        self.request = request
        self.api = api
        self.stream = stream
        self.body_bytes = body_bytes
        self.prompt_tokens = prompt_tokens
        self.lease = lease
        self.started = time.monotonic()
        self.first_token_at: float | None = None
        self.completion_tokens_seen = 0
        self.finished = False

    def saw(self, chunk: TokenChunk) -> None:
        if self.first_token_at is None:
            self.first_token_at = time.monotonic()
        self.completion_tokens_seen += len(chunk.token_ids)

    def finish(self, status: int, final: Completion | ErrorEvent | None = None, *, code: str | None = None) -> None:
        """Release the lease (refunding unused tokens) and log the request. Idempotent; never raises."""
        if self.finished:
            return
        self.finished = True
        completion_tokens = final.usage.completion_tokens if isinstance(final, Completion) else self.completion_tokens_seen
        if self.lease is not None:
            if isinstance(final, Completion):
                used = final.usage.prompt_tokens + final.usage.completion_tokens
            else:
                used = (self.prompt_tokens or 0) + self.completion_tokens_seen if self.prompt_tokens is not None else None
            self.lease.release(used)
        now = time.monotonic()
        try:
            access_log.info(_fields(
                request_id=self.request.request_id, tenant=self.principal.tenant, key_id=self.principal.key_id,
                api=self.api, status=status, code=code or (final.code if isinstance(final, ErrorEvent) else None),
                stream=str(self.stream).lower(), body_bytes=self.body_bytes,
                prompt_sha256=prompt_hash(self.request), prompt_chars=prompt_chars(self.request),
                prompt_tokens=self.prompt_tokens, max_tokens=self.request.sampling.max_tokens,
                completion_tokens=completion_tokens,
                finish=final.finish_reason if isinstance(final, Completion) else None,
                ttft_ms=round((self.first_token_at - self.started) * 1000) if self.first_token_at else None,
                total_ms=round((now - self.started) * 1000),
            ))
        except Exception:  # noqa: BLE001 - logging must never break a reply
            pass


class Gate:
    def __init__(self, settings: EdgeOptions) -> None:
        keep_payloads_out_of_logs()
        self.settings = settings
        defaults = TenantLimits(settings.default_rpm, settings.default_tpm, settings.default_concurrency)
        self.auth = Authenticator(enabled=settings.auth_enabled, keys_file=settings.keys_file,
                                  key_hashes=settings.key_hashes, defaults=defaults)
        self.tokens = TokenCounter(settings.models, settings.max_model_len, enabled=settings.count_tokens)
        self.limiter: Limiter = make_limiter(settings.redis_url)
        timeout = settings.request_timeout_s or 3600.0
        self.lease_ttl_s = timeout + settings.deadline_grace_s + 30.0

    async def start(self) -> None:
        self.tokens.start()
        await self.limiter.start()

    async def stop(self) -> None:
        await self.limiter.stop()
        await self.tokens.stop()

    def authenticate(self, key: str | None, *, api: str) -> Principal:
        try:
            return self.auth.authenticate(key)
        except errors.EdgeError as exc:
            self.rejected(exc, api=api)
            raise

    def rejected(self, exc: errors.EdgeError, *, api: str, principal: Principal | None = None,
                 body_bytes: int | None = None, request: GenerateRequest | None = None) -> None:
        """Access-log line for a request refused before admission."""
        access_log.info(_fields(
            request_id=request.request_id if request is not None else "-",
            tenant=principal.tenant if principal is not None else "-", api=api, status=exc.status,
            code=exc.code or exc.type, param=exc.param, body_bytes=body_bytes,
            prompt_sha256=prompt_hash(request) if request is not None else None,
        ))

    async def admit(self, principal: Principal, request: GenerateRequest, *, api: str, input_param: str,
                    max_tokens_given: bool, stream: bool, body_bytes: int | None = None) -> Ticket:
        """Context check, then the tenant's limits; returns the ticket (whose request may have a capped max_tokens)."""
        try:
            request, prompt_tokens = await self.tokens.check_context(
                request, input_param=input_param, max_tokens_given=max_tokens_given)
            # Without a tokenizer, charge the prompt at a conservative 1 token per 2 characters.
            cost_prompt = prompt_tokens if prompt_tokens is not None else prompt_chars(request) // 2 + 1
            lease = await self.limiter.acquire(principal.tenant, principal.limits,
                                               cost_prompt + request.sampling.max_tokens, self.lease_ttl_s)
        except errors.EdgeError as exc:
            self.rejected(exc, api=api, principal=principal, body_bytes=body_bytes, request=request)
            raise
        return Ticket(self, principal, request, api=api, stream=stream, body_bytes=body_bytes,
                      prompt_tokens=prompt_tokens, lease=lease)
