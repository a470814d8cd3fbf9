"""One request as the client saw it, and the checks every stream must pass.

A :class:`RequestRecord` holds the send time, the arrival time and size of
every chunk, and the final message. Its :class:`StreamChecker` enforces the
stream contract while it is read:

* order: chunk indices are 0, 1, 2, ... without gaps or repeats;
* completeness: the final message's chunk count, the ``[DONE]`` marker and the
  usage token count agree with what arrived (token ids and text);
* a final message: a stream that ends without one is incomplete.

A violation makes the request fail with an error kind ``protocol:<what>``; it is
never counted as a (fast) success. Error kinds:

``http_<status>`` (the server answered with an error status), ``connect`` (no
connection), ``timeout`` (no final message within ``--timeout``),
``error:<code>`` (an error event or error body carrying a code),
``protocol:<what>`` (a broken stream), ``client:<exception>`` (a bug on our side).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from streams.bench.workload import BenchRequest


@dataclass
class StreamedChunk:
    t: float  # arrival, perf_counter seconds
    tokens: int  # tokens this chunk carried (1 when the API does not say)
    index: int | None = None
    drafted: int = 0
    accepted: int = 0


@dataclass
class RequestRecord:
    request: BenchRequest
    request_id: str
    backend: str
    start: float = 0.0  # perf_counter when sent
    end: float | None = None  # perf_counter of the final message
    chunks: list[StreamedChunk] = field(default_factory=list)
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    token_ids_known: bool = True  # False when the API does not expose token ids (plain OpenAI)
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    server: dict[str, Any] = field(default_factory=dict)  # timings/spec the server reported
    error_kind: str | None = None
    error_message: str | None = None
    violations: list[str] = field(default_factory=list)
    final_seen: bool = False
    warmup: bool = False
    scheduled_s: float | None = None  # open loop: when it was due, seconds after the window's start

    # -- outcome ---------------------------------------------------------------

    @property
    def ok(self) -> bool:
        return self.error_kind is None and self.final_seen

    def fail(self, kind: str, message: str = "") -> None:
        """Record the first failure; later ones only add to ``violations``."""
        if self.error_kind is None:
            self.error_kind = kind
            self.error_message = message[:500]
        if kind.startswith("protocol:"):
            self.violations.append(kind)

    # -- figures (seconds) -----------------------------------------------------

    @property
    def output_tokens(self) -> int:
        if self.completion_tokens is not None:
            return self.completion_tokens
        return len(self.token_ids) if self.token_ids_known else sum(c.tokens for c in self.chunks)

    @property
    def first_token_time(self) -> float | None:
        for c in self.chunks:
            if c.tokens > 0:
                return c.t
        return None

    @property
    def ttft(self) -> float | None:
        t = self.first_token_time
        return None if t is None else t - self.start

    @property
    def e2e(self) -> float | None:
        return None if self.end is None else self.end - self.start

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: (e2e - ttft) / (tokens - 1)."""
        ttft, e2e, n = self.ttft, self.e2e, self.output_tokens
        if ttft is None or e2e is None or n < 2:
            return None
        return max(0.0, e2e - ttft) / (n - 1)

    def _token_chunks(self) -> list[StreamedChunk]:
        return [c for c in self.chunks if c.tokens > 0]

    @property
    def inter_chunk(self) -> list[float]:
        """Gaps between consecutive token-carrying chunks."""
        cs = self._token_chunks()
        return [b.t - a.t for a, b in zip(cs, cs[1:])]

    @property
    def itl(self) -> list[float]:
        """Inter-token latency: each gap between chunks, divided among the tokens the later chunk brought.

        A chunk of k tokens after a gap g contributes k values g/k, so every
        token after the first has one value and the mean is comparable with
        TPOT whether or not speculation put several tokens in one chunk.
        """
        cs = self._token_chunks()
        out: list[float] = []
        for a, b in zip(cs, cs[1:]):
            out.extend([(b.t - a.t) / b.tokens] * b.tokens)
        return out

    @property
    def max_itl(self) -> float | None:
        gaps = self.inter_chunk
        return max(gaps) if gaps else None

    @property
    def spec_drafted(self) -> int:
        return sum(c.drafted for c in self.chunks)

    @property
    def spec_accepted(self) -> int:
        return sum(c.accepted for c in self.chunks)

    @property
    def spec_steps(self) -> int:
        """Chunks produced by a step that verified drafts."""
        return sum(1 for c in self.chunks if c.drafted > 0)

    def slo_metrics(self) -> dict[str, float | None]:
        return {"ttft": self.ttft, "tpot": self.tpot, "itl": self.max_itl, "e2e": self.e2e}

    def to_json(self, t0: float) -> dict[str, Any]:
        def r(x: float | None) -> float | None:
            return None if x is None or math.isnan(x) else round(x, 6)

        return {
            "id": self.request_id,
            "index": self.request.index,
            "workload": self.request.workload,
            "ok": self.ok,
            "error": self.error_kind,
            "error_message": self.error_message,
            "start_s": r(self.start - t0),
            "scheduled_s": r(self.scheduled_s),
            "ttft_s": r(self.ttft),
            "tpot_s": r(self.tpot),
            "e2e_s": r(self.e2e),
            "max_itl_s": r(self.max_itl),
            "max_tokens": self.request.max_tokens,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "chunks": len(self.chunks),
            "finish_reason": self.finish_reason,
            "text_chars": len(self.text),
            "spec_drafted": self.spec_drafted,
            "spec_accepted": self.spec_accepted,
        }


class StreamChecker:
    """Feeds a record chunk by chunk and checks the stream contract as it goes."""

    def __init__(self, record: RequestRecord, *, strict_index: bool = True) -> None:
        self.record = record
        # strict: indices must be exactly 0, 1, 2, ... and the final count must match.
        # Not strict (OpenAI SSE, where the edge skips chunks without text): indices must only increase,
        # and none may reach the final count.
        self.strict_index = strict_index
        self._expected_index = 0
        self._max_index = -1

    def chunk(
        self, t: float, *, text: str = "", token_ids: list[int] | None = None, index: int | None = None,
        drafted: int = 0, accepted: int = 0, tokens: int | None = None,
    ) -> None:
        rec = self.record
        if rec.final_seen:
            rec.fail("protocol:after_final", f"chunk {index} after the final message")
            return
        if index is not None:
            if index < self._expected_index:
                kind = "protocol:repeat" if index <= self._max_index and index in self._seen_indices() else "protocol:out_of_order"
                rec.fail(kind, f"chunk index {index} after {self._expected_index - 1}")
                return  # a duplicate is not counted twice
            if index > self._expected_index and self.strict_index:
                rec.fail("protocol:gap", f"chunk index {index} after {self._expected_index - 1}")
            self._expected_index = index + 1
            self._max_index = max(self._max_index, index)
        else:
            self._expected_index += 1
        if token_ids is None:
            rec.token_ids_known = False
            n = tokens if tokens is not None else (1 if text else 0)
        else:
            rec.token_ids.extend(token_ids)
            n = len(token_ids)
        rec.text += text
        rec.chunks.append(StreamedChunk(t=t, tokens=n, index=index, drafted=drafted, accepted=accepted))

    def final(
        self, t: float, *, finish_reason: str | None, num_chunks: int | None = None, text: str | None = None,
        prompt_tokens: int | None = None, completion_tokens: int | None = None, server: dict[str, Any] | None = None,
    ) -> None:
        rec = self.record
        if rec.final_seen:
            rec.fail("protocol:repeated_final", "a second final message")
            return
        rec.final_seen = True
        rec.end = t
        rec.finish_reason = finish_reason
        rec.prompt_tokens = prompt_tokens
        rec.completion_tokens = completion_tokens
        if server:
            rec.server.update(server)
        if num_chunks is not None and not self.strict_index:
            if self._max_index >= num_chunks:
                rec.fail("protocol:extra_chunks", f"chunk index {self._max_index} but the final message counts {num_chunks} chunks")
        elif num_chunks is not None and num_chunks != len(rec.chunks):
            rec.fail("protocol:missing_chunks" if num_chunks > len(rec.chunks) else "protocol:extra_chunks",
                     f"final message counts {num_chunks} chunks, {len(rec.chunks)} arrived")
        if completion_tokens is not None and rec.token_ids_known and completion_tokens != len(rec.token_ids):
            rec.fail("protocol:token_count", f"usage says {completion_tokens} tokens, {len(rec.token_ids)} token ids arrived")
        if text is not None and text != rec.text:
            rec.fail("protocol:text_mismatch", f"final text ({len(text)} chars) differs from the chunks' ({len(rec.text)} chars)")
        if finish_reason is None:
            rec.fail("protocol:no_finish_reason", "final message without finish_reason")

    def _seen_indices(self) -> set[int]:
        return {c.index for c in self.record.chunks if c.index is not None}

    def error(self, t: float, kind: str, message: str = "") -> None:
        rec = self.record
        rec.end = t
        rec.fail(kind, message)

    def close(self, t: float, *, done_marker: bool | None = None) -> None:
        """The stream ended (connection closed, [DONE], or the reader stopped)."""
        rec = self.record
        if rec.error_kind is not None:
            return
        if not rec.final_seen:
            rec.end = t
            rec.fail("protocol:missing_final", "the stream ended without a final message")
        elif done_marker is False:
            rec.fail("protocol:missing_done", "the SSE stream ended without data: [DONE]")
