"""OpenAI-compatible HTTP with ``stream: true``: the edge's /v1/chat/completions and /v1/completions.

httpx streams the response and :class:`SSEParser` splits it, so every chunk is
timed when its bytes arrive. Plain OpenAI chunks carry text only; when the edge
adds specstream's extension fields (token ids, chunk index, speculation stats)
they are used, otherwise each non-empty text delta counts as one chunk and the
usage chunk (``stream_options.include_usage``) gives the token count.
"""
from __future__ import annotations

import json
import time
from typing import Any

import httpx

from streams.bench.backends.base import Backend, BackendOptions, error_code_of, error_message_of
from streams.bench.record import RequestRecord, StreamChecker
from streams.bench.sse import SSEParser


def request_body(record: RequestRecord, model: str, chat: bool) -> dict[str, Any]:
    req = record.request
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": req.max_tokens,
        "temperature": req.sampling.temperature,
        "top_p": req.sampling.top_p,
        "seed": req.seed,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if req.sampling.top_k:
        body["top_k"] = req.sampling.top_k
    if req.sampling.speculation is not None:
        body["speculation"] = req.sampling.speculation
    if chat:
        body["messages"] = req.messages_list() if req.messages is not None else [{"role": "user", "content": req.prompt}]
    else:
        body["prompt"] = req.prompt if req.prompt is not None else "\n\n".join(m["content"] for m in req.messages or ())
    return body


def _extension(chunk: dict[str, Any]) -> dict[str, Any]:
    """specstream's extra per-chunk fields (the edge puts them under ``specstream``: index, spec, num_chunks, ...)."""
    ext = chunk.get("specstream")
    return ext if isinstance(ext, dict) else {}


class OpenAIBackend(Backend):
    name = "openai"

    def __init__(self, options: BackendOptions) -> None:
        super().__init__(options)
        self._client: httpx.AsyncClient | None = None

    async def start(self) -> None:
        headers = {"Authorization": f"Bearer {self.options.api_key}"} if self.options.api_key else {}
        limits = httpx.Limits(max_connections=self.options.max_connections, max_keepalive_connections=self.options.max_connections)
        # Timeouts per operation are generous: the runner enforces the per-request --timeout itself.
        self._client = httpx.AsyncClient(
            base_url=self.options.base_url.rstrip("/"), headers=headers, limits=limits,
            timeout=httpx.Timeout(connect=10.0, read=None, write=30.0, pool=None),
        )

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "base_url": self.options.base_url, "endpoint": self.options.endpoint}

    def _path(self, record: RequestRecord) -> tuple[str, bool]:
        endpoint = self.options.endpoint
        chat = record.request.messages is not None if endpoint == "auto" else endpoint == "chat"
        return ("/v1/chat/completions" if chat else "/v1/completions"), chat

    async def run(self, record: RequestRecord, checker: StreamChecker) -> None:
        assert self._client is not None, "start() first"
        path, chat = self._path(record)
        body = request_body(record, self.options.model, chat)
        record.start = time.perf_counter()
        try:
            async with self._client.stream("POST", path, json=body) as response:
                if response.status_code != 200:
                    raw = await response.aread()
                    now = time.perf_counter()
                    try:
                        payload = json.loads(raw)
                    except ValueError:
                        payload = raw.decode("utf-8", "replace")
                    code = error_code_of(payload)
                    message = (f"[{code}] " if code else "") + error_message_of(payload)
                    checker.error(now, f"http_{response.status_code}", message)
                    return
                await self._read(response, checker, chat)
        except (httpx.ConnectError, httpx.ConnectTimeout) as error:
            checker.error(time.perf_counter(), "connect", f"{type(error).__name__}: {error}")
        except httpx.TimeoutException as error:
            checker.error(time.perf_counter(), "timeout", f"{type(error).__name__}: {error}")
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as error:
            checker.error(time.perf_counter(), "disconnect", f"{type(error).__name__}: {error}")

    async def _read(self, response: httpx.Response, checker: StreamChecker, chat: bool) -> None:
        # The edge sends only chunks with text, so indices may skip (never repeat or go back).
        checker.strict_index = False
        parser = SSEParser()
        finish_reason: str | None = None
        usage: dict[str, Any] | None = None
        num_chunks: int | None = None
        server: dict[str, Any] = {}
        last_index = -1
        done = False
        async for data in response.aiter_bytes():
            now = time.perf_counter()
            for event in parser.feed(data):
                if done:
                    continue  # anything after [DONE] is ignored
                if event.data.strip() == "[DONE]":
                    done = True
                    if checker.record.error_kind is not None:
                        continue  # an error event came before [DONE]: the request failed there
                    checker.final(
                        now, finish_reason=finish_reason, num_chunks=num_chunks,
                        prompt_tokens=(usage or {}).get("prompt_tokens"),
                        completion_tokens=(usage or {}).get("completion_tokens"), server=server,
                    )
                    if usage is None:
                        checker.record.fail("protocol:missing_usage", "no usage chunk before [DONE] (include_usage was asked)")
                    continue
                try:
                    chunk = json.loads(event.data)
                except ValueError:
                    checker.error(now, "protocol:bad_json", f"SSE data is not JSON: {event.data[:120]!r}")
                    continue
                if not isinstance(chunk, dict):
                    checker.error(now, "protocol:bad_json", f"SSE data is not an object: {event.data[:120]!r}")
                    continue
                if "error" in chunk:
                    code = error_code_of(chunk)
                    checker.error(now, f"error:{code}" if code else "error:unknown", error_message_of(chunk))
                    continue
                if isinstance(chunk.get("usage"), dict):
                    usage = chunk["usage"]
                ext = _extension(chunk)
                if ext.get("num_chunks") is not None:
                    num_chunks = ext["num_chunks"]
                    server.update({k: ext[k] for k in ("timings", "spec") if isinstance(ext.get(k), dict)})
                choices = chunk.get("choices") or []
                choice = choices[0] if choices and isinstance(choices[0], dict) else None
                if choice is None:
                    continue
                text = ((choice.get("delta") or {}).get("content") if chat else choice.get("text")) or ""
                token_ids = ext.get("token_ids")
                if text or token_ids:
                    spec = ext.get("spec") or {}
                    index = ext.get("index")
                    drafted, accepted = int(spec.get("drafted", 0) or 0), int(spec.get("accepted", 0) or 0)
                    tokens = None
                    if token_ids is None:
                        # Estimated tokens: this step's accepted drafts + 1, plus one per step skipped for lack of text.
                        skipped = max(0, index - last_index - 1) if isinstance(index, int) else 0
                        tokens = accepted + 1 + skipped
                    checker.chunk(now, text=text, token_ids=token_ids, index=index, drafted=drafted,
                                  accepted=accepted, tokens=tokens)
                    if isinstance(index, int):
                        last_index = index
                if choice.get("finish_reason"):
                    finish_reason = choice["finish_reason"]
        now = time.perf_counter()
        if parser.has_partial and not done:
            checker.error(now, "protocol:truncated_event", "the stream ended inside an SSE event")
        if not done:
            checker.error(now, "protocol:missing_done", "the SSE stream ended without data: [DONE]")
