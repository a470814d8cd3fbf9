"""KV pressure on the real default model (issue 37 item 4): 16 long requests in a quarter of the KV they reserve at
once, the urgent half arriving while the others hold it. Every request completes with the tokens it gives alone,
the urgent ones preempt the others (counted), and nothing is left reserved."""
from __future__ import annotations

import pytest

from bench.prefix_cache import _fresh, generate_staggered, kv_budget_for, pressure_jobs
from engine.config import EngineConfig, SpeculationConfig
from engine.llm_engine import LLMEngine
from tests.unit.engine._engine_factories import every_format_runs, single_thread  # noqa: F401

pytestmark = [pytest.mark.model, pytest.mark.usefixtures("single_thread", "every_format_runs")]


def _engine(prefix_caching: bool, kv_cache_bytes: int = 64 << 20) -> LLMEngine:
    """The default model as served (int4); every format's exactness under preemption is in tests/unit/engine."""
    return LLMEngine.from_config(EngineConfig(
        model="smollm2-135m-instruct", weights="int4", kv_cache_bytes=kv_cache_bytes, prefix_caching=prefix_caching,
        speculation=SpeculationConfig(enabled=True, method="ngram", adaptive=False)))


def test_sixteen_long_requests_in_a_quarter_of_their_kv_all_complete_as_alone_and_the_urgent_ones_preempt() -> None:
    alone_engine = _engine(prefix_caching=False)
    first, later = pressure_jobs(alone_engine, n=16, prompt_words=120, new_tokens=24)
    alone = {j.request_id: alone_engine.generate([j])[j.request_id].token_ids for j in _fresh([*first, *later])}

    engine = _engine(prefix_caching=True, kv_cache_bytes=kv_budget_for(alone_engine, [*first, *later], 0.25))
    got = generate_staggered(engine, _fresh(first), _fresh(later), steps_between=4)

    assert all(r.finished and r.finish_reason == "length" for r in got.values())
    assert {rid: r.token_ids for rid, r in got.items()} == alone
    preemptions = engine.prefix_cache_counters().preemptions
    assert preemptions > 0
    # Only the low-priority half gave its KV back, and each request reports its own.
    assert sum(got[j.request_id].stats.preemptions for j in first) == preemptions
    assert all(got[j.request_id].stats.preemptions == 0 for j in later)
    assert engine.cache_usage().used_tokens == 0
