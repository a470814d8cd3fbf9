"""The deployment-wide checks at the end of a chaos run: only the injected poison was dead-lettered (all of it),
every consumer group caught up, every service's memory stayed flat, every service is running."""
from __future__ import annotations

import asyncio
import collections
import time

from bench.chaos.deployment import Deployment
from bench.chaos.faults import Injected
from bench.chaos.ledger import Check

# (group suffix, topic attribute of the catalog): every consumer group of the deployment and its input.
GROUPS = (("engine-workers", "requests"), ("batch-workers", "batch_lines"), ("parsers", "ingest_jobs"),
          ("indexers", "document_chunks"), ("retrievers", "retrieval"), ("index-admins", "index_commands"),
          ("tool-runners", "tool_intents"), ("batch-assemblers", "batch_results"))
# RSS is judged per incarnation, from its warm-up (a quarter of the run, at least 60 s: a worker loads its model,
# the first full batches and caches allocate) to its end, for incarnations that lived half the run or more; in
# runs of 10 minutes or more: a worker of a 3-minute run is still growing into its batches and adapters (+14 %
# from minute 1 to minute 3 here, flat from minute 5 to 20), so short runs report the figures without a verdict.
RSS_GROWTH = 0.10
JUDGED_FROM_RUN_S = 600.0


async def dead_letters(deployment: Deployment, injected: Injected) -> Check:
    from schemas.topics import TopicCatalog
    from streams.kafka.dead_letter_topic import read_letters

    catalog = TopicCatalog(prefix=deployment.prefix)
    letters = await read_letters(deployment.bootstrap, catalog.dead_letters.name)
    seen: set[tuple[str, str]] = set()
    strays: list[str] = []
    for_deleted = 0  # replies whose reply topic the schedule deleted: their workers keep them as dead letters
    for entry in letters:
        letter = entry.letter
        if letter is None:
            strays.append(f"@{entry.offset} unreadable: {entry.problem}")
            continue
        key = (entry.original_key or b"").decode(errors="replace")
        pair = (letter.source_topic, key)
        if pair in injected.dead_lettered:
            seen.add(pair)
        elif any(f"'{topic}'" in letter.reason for topic in injected.deleted_topics):
            for_deleted += 1
        else:
            strays.append(f"{letter.source_topic}@{letter.source_offset} {letter.reason} (key {key!r})")
    missing = sorted(f"{t} {k}" for t, k in injected.dead_lettered - seen)
    ok = not strays and not missing and bool(injected.dead_lettered)
    detail = (f"{len(letters)} letters for {len(injected.dead_lettered)} injected poison messages "
              f"({len(injected.skipped)} more on topics whose readers skip it), {for_deleted} replies to the deleted "
              "reply topic")
    if strays:
        reasons = collections.Counter(s.split(" ", 2)[1].rstrip(":") for s in strays)
        detail += f"; not injected: {dict(reasons)}, e.g. {strays[:3]}"
    if missing:
        detail += f"; injected but not dead-lettered: {missing[:5]}"
    return Check("dead letters are the injected poison, all of it", ok, detail)


async def lag(deployment: Deployment, timeout_s: float) -> Check:
    """Every group's committed offsets reach its input's end (waiting up to `timeout_s` for the last commits)."""
    from schemas.topics import TopicCatalog
    from streams.testing.reliability import group_lag

    catalog = TopicCatalog(prefix=deployment.prefix)
    deadline = time.monotonic() + timeout_s
    while True:
        behind: dict[str, int] = {}
        for suffix, attribute in GROUPS:
            committed, ends = await group_lag(deployment.bootstrap, f"{deployment.prefix}.{suffix}",
                                              getattr(catalog, attribute).name)
            total = sum(end - max(committed[p], 0) for p, end in ends.items() if end > 0)
            if total:
                behind[suffix] = total
        if not behind or time.monotonic() > deadline:
            break
        await asyncio.sleep(5.0)
    detail = "every group at its input's end" if not behind else f"records behind: {behind}"
    return Check(f"consumer lag back to zero ({len(GROUPS)} groups)", not behind, detail)


def memory(deployment: Deployment, run_s: float) -> Check:
    warmup_s, judged_after_s = max(60.0, run_s / 4), run_s / 2
    judged, grew, figures = 0, [], []
    for service in deployment.services.values():
        for n, life in enumerate(service.incarnations, 1):
            samples = life.rss_mib
            if not samples or samples[-1][0] < max(judged_after_s, warmup_s + 30):
                continue
            warm = next(mib for at, mib in samples if at >= warmup_s)
            judged += 1
            figures.append(f"{service.name}.{n} {warm:.0f} -> {samples[-1][1]:.0f}")
            if samples[-1][1] > warm * (1 + RSS_GROWTH):
                grew.append(figures[-1] + " MiB")
    detail = (f"{judged} incarnations lived past {judged_after_s:.0f}s; RSS from {warmup_s:.0f}s to the end (MiB): "
              f"{', '.join(figures)}")
    if run_s < JUDGED_FROM_RUN_S:
        return Check("memory (not judged in a run under 10 minutes)", True, detail)
    if grew:
        detail += f"; grew more than {RSS_GROWTH:.0%}: {grew}"
    return Check("memory flat after warm-up", not grew and judged > 0, detail)


def running(deployment: Deployment) -> Check:
    down = [s.name for s in deployment.services.values() if not s.alive]
    return Check("every service running at the end", not down, "all" if not down else f"not running: {down}")
