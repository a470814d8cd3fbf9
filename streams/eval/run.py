"""`specstream eval run --samples FILE.jsonl`: publish evaluation samples and score the deployment serving now.

Each sample is published to ``<prefix>.eval-samples`` (keyed by sample id), then sent as a greedy request
(``eval-<run>-<sample id>``) to the deployment's request topic; answers are scored against the samples' reference
answers (exact match after normalisation, token F1), overall and per tag, with error rate and latency percentiles.
"""
from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from schemas.events import EvalSample, GenerateRequest, ReplyRoute, SamplingParams
from schemas.topics import TopicCatalog
from streams.kafka import clients
from streams.config import Settings
from streams.eval.compare import LATENCIES, against_references
from streams.eval.outcome import Outcome
from streams.eval.requester import send_all
from streams.eval.scoring import percentile, rate

SAMPLE_SEED = 0  # greedy requests ignore it; a fixed seed keeps a sampled run reproducible


async def publish_samples(settings: Settings, samples: Sequence[EvalSample]) -> None:
    kafka = settings.kafka
    topic = settings.catalog.eval_samples
    await clients.ensure_topics(kafka, [topic], replication_factor=kafka.replication_factor,
                                 min_insync_replicas=kafka.min_insync_replicas)
    producer = clients.make_producer(kafka, client_id="specstream-eval-samples")
    await producer.start()
    try:
        for sample in samples:
            await producer.send_and_wait(topic.name, clients.encode(sample), key=sample.sample_id.encode())
    finally:
        await producer.stop()


def sample_request(sample: EvalSample, run: str, *, model: str, max_tokens: int) -> GenerateRequest:
    return GenerateRequest(
        request_id=f"eval-{run}-{sample.sample_id}"[:128], prompt=sample.prompt, messages=sample.messages,
        model=model, sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, seed=SAMPLE_SEED),
        reply_to=ReplyRoute(topic="unset"), tenant="eval", created_at=time.time(),
    )


async def run_samples(settings: Settings, samples: Sequence[EvalSample], *, target_prefix: str, reply_prefix: str,
                      max_tokens: int, concurrency: int, timeout_s: float,
                      progress: Callable[[str], None]) -> dict[str, Any]:
    """Publish the samples, send them to the workers serving ``target_prefix``, and return the report (no gates)."""
    await publish_samples(settings, samples)
    progress(f"published {len(samples)} sample(s) to {settings.catalog.eval_samples.name}")
    run = uuid.uuid4().hex[:8]
    requests = [sample_request(s, run, model=settings.engine.model, max_tokens=max_tokens) for s in samples]
    request_topic = TopicCatalog(prefix=target_prefix).requests.name
    answers = await send_all(settings.kafka, request_topic, reply_prefix, requests, concurrency=concurrency,
                             timeout_s=timeout_s, progress=progress)
    scored = [(s, Outcome.of(answers[r.request_id])) for s, r in zip(samples, requests)]
    return {"kind": "run", "target_prefix": target_prefix, "run": run, "scores": score(scored)}


def score(scored: Sequence[tuple[EvalSample, Outcome]]) -> dict[str, Any]:
    with_reference = [(s, o) for s, o in scored if s.reference is not None]
    tags = sorted({t for s, _ in with_reference for t in s.tags})
    return {
        "samples": len(scored),
        "error_rate": {"candidate": rate(sum(o.failed for _, o in scored), len(scored))},
        "reference": {"count": len(with_reference), "candidate": _against(with_reference)} if with_reference else None,
        "per_tag": {tag: {"count": len(group), **_against(group)}
                    for tag in tags if (group := [(s, o) for s, o in with_reference if tag in s.tags])},
        "latency": {name: _percentiles([v for _, o in scored if (v := getattr(o, name)) is not None])
                    for name in LATENCIES},
        "per_sample": [{"sample_id": s.sample_id, "tags": s.tags, "answer": o.text, "reference": s.reference,
                        "error": o.error_code, "finish_reason": o.finish_reason} for s, o in scored],
    }


def _against(group: Sequence[tuple[EvalSample, Outcome]]) -> dict[str, float | None]:
    return against_references([(o.text or "", s.reference or "") for s, o in group])


def _percentiles(values: Sequence[float]) -> dict[str, float | None]:
    return {f"p{q}": percentile(values, q) for q in (50, 99)}
