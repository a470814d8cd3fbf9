"""The one way in: every generation request, HTTP or websocket, passes the same five stages before Kafka.

::

    read      HTTP body / websocket frame, size limits          413 / close 1009   admission.read
    parse     strict UTF-8 JSON -> the API's typed body         400                wire.parse, wire.bodies
    build     the wire GenerateRequest, edge-assigned fields                       wire.build
    validate  the served model; prompt + max_tokens vs context  404 / 400          admission.validate
    admit     the tenant's limits -> a Ticket                   429                admission.admit

Each stage takes the previous stage's output and returns its own. Building
comes before validating because the context check renders the wire request
exactly as the worker will (its chat template, its token count), and the
default ``max_tokens`` it caps is the built one. The caller
(:mod:`streams.edge.openai_api`, :mod:`streams.edge.ws`) was authenticated
first (401 / close 1008) and publishes the ticket's request afterwards.
:class:`Pipeline` (one per app, ``app.state.pipeline``) owns what the stages
need (the authenticator, the tokenizers, the limiter) and writes the
access-log line of every refusal (:mod:`streams.edge.access`).

The stage order is the order of the errors: a request with a bad field and an
unknown model gets the 400; a request over its tenant's limits is refused only
once it is otherwise valid, and a refused request is never charged.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Request

from schemas.events import GenerateRequest, TraceContext
from streams.edge import access
from streams.edge.admission.admit import Ticket, admit
from streams.edge.admission.read import read_body
from streams.edge.admission.validate import validate
from streams.edge.auth import Authenticator
from streams.edge.keys import Principal, TenantLimits
from streams.edge.limits import Limiter, make_limiter
from streams.edge.settings import EdgeOptions
from streams.edge.tokenizers import Tokenizers
from streams.wire import errors
from streams.wire.bodies import Body
from streams.wire.build import build_request, conversation_of, trace_context
from streams.wire.parse import decode_json, parse_body

# Completes a parsed body before it is built; may refuse it (EdgeError).
Prepare = Callable[[Any], Awaitable[None]]


class Pipeline:
    def __init__(self, options: EdgeOptions) -> None:
        access.keep_payloads_out_of_logs()
        self.options = options
        auth, limits = options.edge.auth, options.edge.limits
        self.auth = Authenticator(enabled=auth.enabled, keys_file=auth.keys_file, key_hashes=tuple(auth.key_hashes),
                                  defaults=TenantLimits(**limits.model_dump()))
        self.tokenizers = Tokenizers(options.models, options.max_model_len)
        # LoRA adapters served now, name -> base model (the edge sets it to what live workers announce).
        self.served_adapters: Callable[[], dict[str, str]] = dict
        self.limiter: Limiter = make_limiter(options.edge.redis_url)
        # A lease outlives its request's deadline a little, so that a crashed edge's leases expire (Redis).
        self.lease_ttl_s = (options.edge.request_timeout_s or 3600.0) + options.edge.deadline_grace_s + 30.0

    async def start(self) -> None:
        self.tokenizers.start()
        await self.limiter.start()

    async def stop(self) -> None:
        await self.limiter.stop()
        await self.tokenizers.stop()

    def authenticate(self, key: str | None, *, api: str) -> Principal:
        """The caller of ``key`` (401 ``missing_api_key`` / ``invalid_api_key``, logged, otherwise)."""
        try:
            return self.auth.authenticate(key)
        except errors.EdgeError as exc:
            access.refused(exc, api=api)
            raise

    async def admit_http(self, caller: Principal, body_type: type[Body], request: Request, *,
                         prepare: Prepare | None = None) -> Ticket:
        """Read, parse, build, validate and admit an HTTP request's body."""
        size: int | None = None
        try:
            raw = await read_body(request, self.options.edge.max_body_bytes)
            size = len(raw)
            data = decode_json(raw)
        except errors.EdgeError as exc:
            access.refused(exc, api=body_type.api, principal=caller, body_bytes=size)
            raise
        return await self.admit(caller, body_type, data, body_bytes=size, trace=trace_context(request.headers),
                                conversation_id=conversation_of(request.headers), prepare=prepare)

    async def admit(self, caller: Principal, body_type: type[Body], data: dict[str, Any], *,
                    body_bytes: int | None = None, trace: TraceContext | None = None,
                    conversation_id: str | None = None, prepare: Prepare | None = None) -> Ticket:
        """Parse, build, validate and admit a decoded JSON object (a websocket frame's, or an HTTP body's).
        ``prepare``: completes the parsed body from elsewhere before it is built (a stored conversation)."""
        request: GenerateRequest | None = None
        try:
            body = parse_body(body_type, data)
            if prepare is not None:
                await prepare(body)
            request = build_request(body, self.options, tenant=caller.tenant, log_prompt=caller.log_prompts,
                                    trace=trace, conversation_id=conversation_id)
            adapters = self.served_adapters()
            validated = await validate(request, (*self.options.models, *adapters), self.tokenizers,
                                       base=adapters.get(request.model), input_param=body.input_param,
                                       max_tokens_given=body.max_new_tokens() is not None)
            request = validated.request
            return await admit(self.limiter, caller, body, validated, lease_ttl_s=self.lease_ttl_s,
                               body_bytes=body_bytes)
        except errors.EdgeError as exc:
            access.refused(exc, api=body_type.api, principal=caller, body_bytes=body_bytes, request=request)
            raise
