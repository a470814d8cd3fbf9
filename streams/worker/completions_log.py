"""What a worker writes to ``<prefix>.completions``: one :class:`CompletionRecord` per finished request.

The worker publishes the record after the request's final reply event (Completion or ErrorEvent) was acknowledged,
so the log never holds an answer its client could not have received. A request regenerated after a redelivery can
be recorded twice; records are keyed by request_id and readers keep the first (:mod:`streams.eval.source`).
"""
from __future__ import annotations

import hashlib
import json
import time

from engine.config import EngineConfig
from schemas.events import Completion, CompletionRecord, ErrorEvent, GenerateRequest

# Engine settings that only size or place the work (where it runs, how much memory it may take, how many requests
# share a step): they change how fast, not what is generated, so two workers differing only in them share a
# fingerprint.
_CAPACITY_ONLY = {"device", "kv_cache_bytes", "kv_cache_fraction", "max_running_requests", "max_batched_tokens",
                  "batch_max_share", "batch_headroom", "batch_step_tokens", "prepack_weights", "kernel_dispatch", "fused_step",
                  "threads", "prefix_caching"}


def config_fingerprint(engine: EngineConfig) -> str:
    """A stable hash of the engine settings that decide the text (model, dtype, context, speculation): 16 hex digits."""
    settings = {k: v for k, v in engine.model_dump(mode="json").items() if k not in _CAPACITY_ONLY}
    canonical = json.dumps(settings, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def completion_record(request: GenerateRequest, final: Completion | ErrorEvent, *, worker_id: str,
                      fingerprint: str, served_model: str | None) -> CompletionRecord:
    """The record of one finished request; without the request (prompt) when it asked not to be logged."""
    return CompletionRecord(
        request_id=request.request_id,
        tenant=request.tenant,
        model=request.model,
        sampling=request.sampling,
        request=request if request.log_prompt else None,
        completion=final if isinstance(final, Completion) else None,
        error=final if isinstance(final, ErrorEvent) else None,
        served_model=served_model,
        worker_id=worker_id,
        config_fingerprint=fingerprint,
        recorded_at=time.time(),
    )
