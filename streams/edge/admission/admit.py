"""Stage 5, admit: charge the request to the caller's tenant, and the ticket that carries it until it ends.

Admission takes a lease on the tenant's limits (:mod:`streams.edge.limits`):
one request of its rpm, prompt tokens + ``max_tokens`` of its tpm, one of its
concurrency; over any of them it is 429 (``Retry-After``), and a refused
request is not charged. The :class:`Ticket` is then held while the request is
published and its reply relayed: ``saw(chunk)`` for each chunk, and
``finish(status, final)`` once at the end, which returns the lease (refunding
the tokens it did not use) and writes the access-log line.
"""
from __future__ import annotations

import time

from schemas.events import Completion, ErrorEvent, TokenChunk
from streams.edge import access
from streams.edge.admission.validate import Validated
from streams.edge.keys import Principal
from streams.edge.limits import Lease, Limiter
from streams.wire.bodies import Body


class Ticket:
    """An admitted request: what the client asked, the wire request, its lease, and what the access log needs."""

    def __init__(self, principal: Principal, body: Body, validated: Validated, lease: Lease | None, *,
                 body_bytes: int | None) -> None:
        self.principal = principal
        self.body = body
        self.request = validated.request
        self.prompt_tokens = validated.prompt_tokens
        self.lease = lease
        self.body_bytes = body_bytes
        self.started = time.monotonic()
        self.first_token_at: float | None = None
        self.completion_tokens_seen = 0
        self.finished = False

    @property
    def input_param(self) -> str:
        return self.body.input_param

    def saw(self, chunk: TokenChunk) -> None:
        if self.first_token_at is None:
            self.first_token_at = time.monotonic()
        self.completion_tokens_seen += len(chunk.token_ids)

    def finish(self, status: int, final: Completion | ErrorEvent | None = None, *, code: str | None = None) -> None:
        """Release the lease (refunding unused tokens) and log the request. Idempotent; never raises."""
        if self.finished:
            return
        self.finished = True
        if self.lease is not None:
            self.lease.release(self._tokens_used(final))
        try:
            self._log(status, final, code)
        except Exception:  # noqa: BLE001 - logging must never break a reply
            pass

    def _tokens_used(self, final: Completion | ErrorEvent | None) -> int | None:
        if isinstance(final, Completion):
            return final.usage.prompt_tokens + final.usage.completion_tokens
        if self.prompt_tokens is None:
            return None  # unknown: nothing is refunded
        return self.prompt_tokens + self.completion_tokens_seen

    def _log(self, status: int, final: Completion | ErrorEvent | None, code: str | None) -> None:
        request = self.request
        completed = final if isinstance(final, Completion) else None
        access.line(
            request_id=request.request_id, tenant=self.principal.tenant, key_id=self.principal.key_id,
            api=self.body.api, status=status, code=code or (final.code if isinstance(final, ErrorEvent) else None),
            stream=str(self.body.streams).lower(), body_bytes=self.body_bytes,
            prompt_sha256=access.prompt_hash(request), prompt_chars=access.prompt_chars(request),
            prompt_tokens=self.prompt_tokens, max_tokens=request.sampling.max_tokens,
            completion_tokens=completed.usage.completion_tokens if completed else self.completion_tokens_seen,
            finish=completed.finish_reason if completed else None,
            ttft_ms=round((self.first_token_at - self.started) * 1000) if self.first_token_at else None,
            total_ms=round((time.monotonic() - self.started) * 1000),
        )


async def admit(limiter: Limiter, principal: Principal, body: Body, validated: Validated, *, lease_ttl_s: float,
                body_bytes: int | None = None) -> Ticket:
    """The ticket of a request charged to the caller's tenant (429 when over one of its limits)."""
    request = validated.request
    # Without a tokenizer, charge the prompt at a conservative 1 token per 2 characters.
    prompt_tokens = validated.prompt_tokens
    if prompt_tokens is None and request.prompt_token_ids is not None:
        prompt_tokens = len(request.prompt_token_ids)
    if prompt_tokens is None:
        prompt_tokens = access.prompt_chars(request) // 2 + 1
    # n choices: each its own sequence with its own prompt and answer.
    tokens = (prompt_tokens + request.sampling.max_tokens) * body.choices
    lease = await limiter.acquire(principal.tenant, principal.limits, tokens, lease_ttl_s)
    return Ticket(principal, body, validated, lease, body_bytes=body_bytes)
