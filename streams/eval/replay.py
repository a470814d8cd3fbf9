"""`specstream eval replay`: the recorded requests, replayed against a candidate, compared with what was recorded.

1. Read ``<prefix>.completions`` from ``--since`` or ``--from-offset`` to its end, first record per request_id,
   optionally of one tenant; requests whose prompt was not logged are counted, not replayed.
2. Apply the candidate file's ``eval.candidate_sampling`` (its serving policy) to each request; seeds are kept,
   so greedy and seeded requests of an identical candidate regenerate the recorded text.
3. Start a candidate worker on a derived prefix (or use ``--target-prefix``), send every request with at most
   ``--concurrency`` outstanding, collect the answers, and compare (:mod:`streams.eval.compare`).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schemas.events import CompletionRecord, GenerateRequest
from schemas.topics import TopicCatalog
from streams.config import CandidateSampling, Settings
from streams.eval.candidate import started_candidate
from streams.eval.compare import compare
from streams.worker.completions_log import config_fingerprint
from streams.eval.outcome import Outcome, Pair
from streams.eval.requester import Final, send_all
from streams.eval.source import Selection, input_key


@dataclass(frozen=True)
class ReplayPlan:
    settings: Settings  # the recording deployment (whose completions are read)
    selection: Selection
    candidate_config: Path | None  # None: --target-prefix
    candidate_settings: Settings
    target_prefix: str | None
    concurrency: int
    timeout_s: float
    ready_timeout_s: float
    references: dict[str, tuple[str, tuple[str, ...]]]  # input key -> (reference answer, tags)
    reply_prefix: str  # answers come on <reply_prefix>.replies.eval-<tag>


def candidate_request(record: CompletionRecord, policy: CandidateSampling) -> GenerateRequest:
    """The recorded request as the candidate deployment would send it to its workers."""
    assert record.request is not None
    sampling = record.request.sampling
    changes: dict[str, Any] = {k: v for k in ("temperature", "top_p", "top_k") if (v := getattr(policy, k)) is not None}
    if policy.max_tokens_cap is not None:
        changes["max_tokens"] = min(sampling.max_tokens, policy.max_tokens_cap)
    return record.request.model_copy(update={"sampling": sampling.model_copy(update=changes)})


async def replay(plan: ReplayPlan, progress: Callable[[str], None]) -> dict[str, Any]:
    """Run the replay and return the report (without gates)."""
    records = plan.selection.records
    requests = [candidate_request(r, plan.candidate_settings.eval.candidate_sampling) for r in records]
    kafka = plan.settings.kafka
    progress(f"replaying {len(requests)} recorded request(s); not replayable: {plan.selection.prompt_not_logged} "
             f"without a logged prompt")
    if plan.target_prefix is not None:
        answers = await send_all(kafka, TopicCatalog(prefix=plan.target_prefix).requests.name, plan.reply_prefix,
                                 requests, concurrency=plan.concurrency, timeout_s=plan.timeout_s, progress=progress)
    else:
        assert plan.candidate_config is not None
        async with started_candidate(plan.candidate_settings, plan.candidate_config, kafka, plan.reply_prefix,
                                     ready_timeout_s=plan.ready_timeout_s, progress=progress) as candidate:
            answers = await send_all(kafka, candidate.settings.catalog.requests.name, plan.reply_prefix, requests,
                                     concurrency=plan.concurrency, timeout_s=plan.timeout_s, progress=progress)
    pairs = pair_up(records, answers, plan.references)
    return {
        "kind": "replay",
        "recorded": {"topic": plan.settings.catalog.completions.name, **plan.selection.counts(),
                     "config_fingerprints": sorted({r.config_fingerprint for r in records})},
        "candidate": {"config": str(plan.candidate_config) if plan.candidate_config else None,
                      "target_prefix": plan.target_prefix,
                      "config_fingerprint": config_fingerprint(plan.candidate_settings.engine),
                      "sampling_policy": plan.candidate_settings.eval.candidate_sampling.model_dump()},
        "scores": compare(pairs),
    }


def pair_up(records: list[CompletionRecord], answers: dict[str, Final],
            references: dict[str, tuple[str, tuple[str, ...]]]) -> list[Pair]:
    pairs = []
    for record in records:
        recorded = record.completion if record.completion is not None else record.error
        assert recorded is not None and record.request is not None
        reference, tags = references.get(input_key(record.request.prompt, record.request.messages), (None, ()))
        pairs.append(Pair(record.request_id, Outcome.of(recorded), Outcome.of(answers[record.request_id]),
                          reference, tags))
    return pairs
