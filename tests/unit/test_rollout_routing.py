"""Canary routing and gates: who goes to the candidate, and when a candidate fails its step."""
from __future__ import annotations

import time

import pytest

from schemas.events import Completion, ErrorEvent, RolloutState, SpecStats, Timings, Usage
from schemas.topics import TopicCatalog
from streams.commands.rollout import duration_s, steps_of
from streams.ops.rollout_gates import Gates, PoolFigures, PoolStats, failed_gate
from streams.ops.rollout_router import RolloutRouter, bucket, candidate_prefix, to_candidate

IDS = [f"chatcmpl-{i:05d}" for i in range(4000)]


def state(percent: float, status: str = "running") -> RolloutState:
    return RolloutState(model="m", rollout_id="r1", candidate_prefix=candidate_prefix("specstream"), state=status,
                        percent=percent, steps=[1, 5, 20, 50, 100], at=time.time())


@pytest.mark.parametrize("percent", [1, 5, 20, 50])
def test_the_candidate_gets_its_share_of_request_ids(percent: float) -> None:
    share = sum(to_candidate(state(percent), i) for i in IDS) / len(IDS)
    assert abs(share - percent / 100) < 0.02


def test_raising_the_share_only_moves_requests_to_the_candidate_never_back() -> None:
    for low, high in [(1, 5), (5, 20), (20, 50), (50, 100)]:
        assert all(to_candidate(state(high), i) for i in IDS if to_candidate(state(low), i))
    assert all(to_candidate(state(100), i) for i in IDS)


CONVERSATIONS = [f"conv-{i:05d}" for i in range(4000)]


@pytest.mark.parametrize("percent", [1, 5, 20, 50])
def test_the_candidate_gets_its_share_of_conversations(percent: float) -> None:
    share = sum(to_candidate(state(percent), "any", c) for c in CONVERSATIONS) / len(CONVERSATIONS)
    assert abs(share - percent / 100) < 0.02


def test_every_request_of_a_conversation_lands_in_one_pool_while_the_share_holds() -> None:
    router = RolloutRouter("127.0.0.1:9", TopicCatalog("specstream"), log_changes=False)
    for conversation in CONVERSATIONS[:500]:
        pools = set()
        # Turns of one conversation (new request ids) across states that keep the share: running, paused, resumed.
        for turn, status in enumerate(["running", "paused", "running", "completed"]):
            router.states["m"] = state(20, status)
            pools.add(router.request_topic("m", f"chatcmpl-{conversation}-{turn}", conversation))
        assert len(pools) == 1, conversation
    # Without a conversation, the request id decides, so the turns of one client spread over both pools.
    router.states["m"] = state(50)
    assert len({router.request_topic("m", f"chatcmpl-{turn}") for turn in range(50)}) == 2


def test_raising_the_share_moves_whole_conversations_to_the_candidate_never_back() -> None:
    for low, high in [(1, 5), (5, 20), (20, 50)]:
        assert all(to_candidate(state(high), "r", c) for c in CONVERSATIONS if to_candidate(state(low), "r", c))


def test_a_request_id_always_lands_in_the_same_bucket_on_every_edge() -> None:
    # The first 8 bytes of SHA-256, big-endian, mod 10000, in hundredths (`echo -n req-6f1c | sha256sum`: 639cdb7e...)
    assert bucket("req-6f1c") == bucket("req-6f1c") == 38.17


@pytest.mark.parametrize("status", ["rolled_back", "aborted"])
def test_nothing_goes_to_a_candidate_that_was_rolled_back_or_aborted(status: str) -> None:
    assert not any(to_candidate(state(100, status), i) for i in IDS)


def test_the_router_names_the_candidate_pools_topics_and_cancels_in_both() -> None:
    router = RolloutRouter("127.0.0.1:9092", TopicCatalog("specstream"))
    assert router.request_topic("m", IDS[0]) == "specstream.requests"  # no rollout known
    router.states["m"] = state(100)
    assert router.request_topic("m", IDS[0]) == "specstream-candidate.requests"
    assert router.request_topic("other-model", IDS[0]) == "specstream.requests"
    assert router.cancel_topics() == ["specstream.cancellations", "specstream-candidate.cancellations"]


def completion(ttft: float, total: float, tokens: int = 11, drafted: int = 0, accepted: int = 0) -> Completion:
    return Completion(request_id="r", text="x", finish_reason="length", num_chunks=1,
                      usage=Usage(prompt_tokens=5, completion_tokens=tokens, total_tokens=5 + tokens),
                      timings=Timings(queued_s=0.0, ttft_s=ttft, total_s=total),
                      spec=SpecStats(drafted=drafted, accepted=accepted))


def pool(*events: Completion | ErrorEvent) -> PoolFigures:
    stats = PoolStats()
    for event in events:
        stats.add(event)
    return stats.figures()


HEALTHY = pool(*[completion(0.2, 1.2, drafted=50, accepted=30) for _ in range(10)])
ERROR = ErrorEvent(request_id="r", code="context_length_exceeded", message="too long")


def test_a_candidate_like_stable_holds() -> None:
    assert failed_gate(Gates(), HEALTHY, HEALTHY, dead_letters=0) is None


def test_errors_fail_the_step_once_there_are_two_and_the_rate_is_above_stables() -> None:
    assert failed_gate(Gates(), pool(completion(0.2, 1.2), ERROR), HEALTHY, 0) is None  # one could be bad luck
    reason = failed_gate(Gates(), pool(completion(0.2, 1.2), ERROR, ERROR), HEALTHY, 0)
    assert reason is not None and reason.startswith("error rate: candidate 67 %")
    assert "context_length_exceeded x2" in reason


def test_a_slow_first_token_or_slow_tokens_fail_the_step() -> None:
    slow_start = pool(*[completion(2.0, 3.0) for _ in range(10)])
    assert "p99 TTFT" in (failed_gate(Gates(), slow_start, HEALTHY, 0) or "")
    slow_tokens = pool(*[completion(0.2, 5.2) for _ in range(10)])  # 500 ms per token against 100
    assert "inter-token latency" in (failed_gate(Gates(), slow_tokens, HEALTHY, 0) or "")
    assert failed_gate(Gates(), pool(*[completion(2.0, 3.0)] * 4), HEALTHY, 0) is None  # too few to compare


def test_lower_acceptance_fails_only_with_enough_drafted_tokens() -> None:
    worse = pool(*[completion(0.2, 1.2, drafted=50, accepted=5) for _ in range(10)])
    assert "acceptance rate: candidate 0.10 against stable 0.60" in (failed_gate(Gates(), worse, HEALTHY, 0) or "")
    assert failed_gate(Gates(min_drafted=1000), worse, HEALTHY, 0) is None


def test_a_dead_letter_fails_the_step() -> None:
    assert (failed_gate(Gates(), HEALTHY, HEALTHY, dead_letters=1) or "").startswith("dead letters")


@pytest.mark.parametrize(("text", "seconds"), [("10m", 600), ("30s", 30), ("1.5h", 5400), ("45", 45), ("500ms", 0.5)])
def test_durations_read_as_people_write_them(text: str, seconds: float) -> None:
    assert duration_s(text, "--hold") == seconds


@pytest.mark.parametrize("text", ["5,1", "0,50", "1,101", "a,b", "5,5"])
def test_steps_must_rise_within_0_and_100(text: str) -> None:
    with pytest.raises(ValueError, match="--steps"):
        steps_of(text)


async def test_an_unreachable_prometheus_is_a_prometheus_error_naming_it() -> None:
    from streams.ops.rollout_prometheus import PrometheusError, PrometheusGates

    with pytest.raises(PrometheusError, match=r"^http://127.0.0.1:9: ConnectError"):
        await PrometheusGates("http://127.0.0.1:9/", timeout_s=2.0).figures()
