"""A batch's lines as requests on the bus: one ``GenerateRequest`` per line, built as an interactive one is.

Each line's body goes through the edge's own build stage (:func:`streams.wire.build.build_request`),
then takes the batch's fields: request id ``<batch id>.<line>`` (a redelivered line keeps it, so it is answered
once), the lowest priority, the batch-results topic as its reply route, and the batch's expiry as its deadline
(a line not started by then is answered ``deadline_exceeded`` and counted as expired).

Seeds: a line that gives a seed keeps it. One that gives none gets a seed derived from its custom_id and its
body, not a random one, so the same line gives the same text when the batch is run again, sampling or not.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from schemas.batch import BATCH_PRIORITY, line_request_id
from schemas.events import GenerateRequest
from streams.batch.validation import BatchLine
from streams.config import EdgeSettings
from streams.wire.build import build_request


@dataclass(frozen=True)
class _LineAssigns:
    """What a line's build stage assigns from: the edge's defaults, and the batch-results topic as reply route."""
    edge: EdgeSettings
    reply_topic: str


def line_seed(line: BatchLine) -> int:
    """A seed that depends only on the line's content."""
    canonical = json.dumps({"custom_id": line.custom_id, "url": line.url,
                            "body": line.body.model_dump(mode="json", exclude_none=True)}, sort_keys=True)
    return int.from_bytes(hashlib.sha256(canonical.encode()).digest()[:8], "big") >> 1


def line_request(line: BatchLine, *, batch_id: str, tenant: str, results_topic: str, expires_at: float,
                 edge: EdgeSettings, log_prompt: bool = True, now: float | None = None) -> GenerateRequest:
    request = build_request(line.body, _LineAssigns(edge, results_topic), tenant=tenant, log_prompt=log_prompt,
                            request_id=line_request_id(batch_id, line.number), now=now)
    sampling = request.sampling
    if line.body.seed is None:
        sampling = sampling.model_copy(update={"seed": line_seed(line)})
    return request.model_copy(update={
        "priority": BATCH_PRIORITY, "deadline": expires_at,
        "sampling": sampling,
    })

