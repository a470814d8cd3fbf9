"""The measures of `specstream eval`: exact match, first divergence, length ratio, token F1, percentiles and deltas,
and the scores of eval samples against their references."""
from __future__ import annotations

import pytest

from schemas.events import Completion, ErrorEvent, EvalSample, SpecStats, Timings, Usage
from streams.eval.compare import compare
from streams.eval.outcome import Outcome, Pair
from streams.eval.run import score
from streams.eval.scoring import delta, first_divergence, length_ratio, percentile, reference_match, token_f1


def test_first_divergence_is_the_first_differing_character_and_none_for_equal_texts() -> None:
    assert first_divergence("Kafka is a log", "Kafka is a log") is None
    assert first_divergence("Kafka is a log", "Kafka was a log") == 6
    assert first_divergence("", "x") == 0


def test_first_divergence_of_a_prefix_is_where_the_shorter_text_ends() -> None:
    assert first_divergence("Kafka is a log", "Kafka") == 5
    assert first_divergence("Kafka", "Kafka is a log") == 5


def test_length_ratio_is_candidate_over_recorded_tokens_and_undefined_without_recorded_tokens() -> None:
    assert length_ratio(4, 12) == pytest.approx(1 / 3)
    assert length_ratio(12, 12) == 1.0
    assert length_ratio(3, 0) is None


def test_token_f1_is_the_harmonic_mean_of_word_precision_and_recall_ignoring_case_and_punctuation() -> None:
    assert token_f1("Paris.", "paris") == 1.0
    # 2 common words; precision 2/3, recall 2/4.
    assert token_f1("the city Paris", "Paris is the capital") == pytest.approx(2 * (2 / 3) * (2 / 4) / (2 / 3 + 2 / 4))
    assert token_f1("Berlin", "Paris") == 0.0
    assert token_f1("", "") == 1.0 and token_f1("", "Paris") == 0.0


def test_token_f1_counts_repeated_words_only_as_often_as_the_reference_has_them() -> None:
    assert token_f1("yes yes yes", "yes") == pytest.approx(2 * (1 / 3) * 1 / (1 / 3 + 1))


def test_reference_match_ignores_case_punctuation_and_spacing_but_not_words() -> None:
    assert reference_match("  Paris! ", "paris")
    assert not reference_match("Paris, France", "Paris")


def test_percentile_interpolates_between_closest_ranks() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert percentile(values, 50) == 3.0
    assert percentile(values, 99) == pytest.approx(4.96)
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None


def test_delta_gives_the_change_and_the_change_relative_to_the_recording() -> None:
    moved = delta(0.2, 0.25)
    assert moved.change == pytest.approx(0.05) and moved.relative == pytest.approx(0.25)
    assert delta(None, 0.3).change is None
    assert delta(0.0, 0.1).relative is None


def _completion(text: str, tokens: int, *, finish: str = "length", ttft: float = 0.1, total: float = 1.0,
                drafted: int = 0, accepted: int = 0) -> Completion:
    return Completion(request_id="r", text=text, finish_reason=finish, num_chunks=1,  # type: ignore[arg-type]
                      usage=Usage(prompt_tokens=5, completion_tokens=tokens, total_tokens=5 + tokens),
                      timings=Timings(queued_s=0.0, ttft_s=ttft, total_s=total),
                      spec=SpecStats(drafted=drafted, accepted=accepted,
                                     acceptance_rate=accepted / drafted if drafted else 0.0))


def test_outcome_takes_inter_token_latency_from_the_time_after_the_first_token() -> None:
    outcome = Outcome.of(_completion("abc", 5, ttft=0.2, total=1.0))
    assert outcome.itl_s == pytest.approx(0.2)
    assert Outcome.of(_completion("a", 1)).itl_s is None
    assert Outcome.of(_completion("a", 1)).acceptance_rate is None  # nothing drafted: no rate to compare
    failed = Outcome.of(ErrorEvent(request_id="r", code="internal_error", message="boom"))
    assert failed.failed and failed.text is None


def _pair(recorded: Completion | ErrorEvent, candidate: Completion | ErrorEvent, reference: str | None = None) -> Pair:
    return Pair("r", Outcome.of(recorded), Outcome.of(candidate), reference)


def test_compare_counts_exact_matches_divergences_lengths_and_finish_reason_changes() -> None:
    pairs = [
        _pair(_completion("Kafka is a log", 4), _completion("Kafka is a log", 4)),
        _pair(_completion("Kafka is a log", 4), _completion("Kafka", 1)),
        _pair(_completion("Paris", 2, finish="stop"), _completion("Paris is", 4)),
        _pair(_completion("x", 1), ErrorEvent(request_id="r", code="internal_error", message="boom")),
    ]
    scores = compare(pairs)
    assert scores["exact_match_rate"] == 0.25
    assert scores["first_divergence"]["diverged"] == 2
    assert scores["first_divergence"]["min_chars"] == 5
    assert scores["length_ratio"]["mean"] == pytest.approx((1 + 0.25 + 2) / 3)
    assert scores["finish_reason_changes"]["by_change"] == {"stop->length": 1, "length->error:internal_error": 1}
    assert scores["error_rate"]["recorded"] == 0.0 and scores["error_rate"]["candidate"] == 0.25
    assert scores["reference"] is None


def test_compare_reports_latency_percentile_deltas_and_speculation_means() -> None:
    pairs = [_pair(_completion("a", 3, ttft=0.1, drafted=4, accepted=2), _completion("a", 3, ttft=0.15, drafted=4, accepted=4)),
             _pair(_completion("b", 3, ttft=0.3), _completion("b", 3, ttft=0.6))]
    scores = compare(pairs)
    ttft = scores["latency"]["ttft_s"]
    assert ttft["p50"]["recorded"] == pytest.approx(0.2) and ttft["p50"]["candidate"] == pytest.approx(0.375)
    assert ttft["p99"]["relative"] == pytest.approx(0.5955 / 0.298 - 1)
    assert scores["speculation"]["acceptance_rate"]["recorded"] == 0.5
    assert scores["speculation"]["acceptance_rate"]["candidate"] == 1.0


def test_compare_scores_both_sides_against_reference_answers_when_known() -> None:
    pairs = [_pair(_completion("Paris", 1), _completion("Paris, France", 2), reference="paris"),
             _pair(_completion("x", 1), _completion("x", 1))]
    reference = compare(pairs)["reference"]
    assert reference["count"] == 1
    assert reference["recorded"] == {"exact_match": 1.0, "token_f1": 1.0}
    assert reference["candidate"]["exact_match"] == 0.0
    assert reference["candidate"]["token_f1"] == pytest.approx(2 / 3)


def test_samples_are_scored_against_their_references_overall_and_per_tag() -> None:
    def sample(sample_id: str, reference: str | None, *tags: str) -> EvalSample:
        return EvalSample(sample_id=sample_id, prompt="q", reference=reference, tags=list(tags))

    failed = Outcome.of(ErrorEvent(request_id="r", code="internal_error", message="boom"))
    scores = score([(sample("a", "Paris", "geo"), Outcome.of(_completion("paris.", 1))),
                    (sample("b", "Rome", "geo", "hard"), Outcome.of(_completion("Milan", 1))),
                    (sample("c", None), Outcome.of(_completion("anything", 1))),
                    (sample("d", "Oslo", "hard"), failed)])
    assert scores["samples"] == 4 and scores["error_rate"]["candidate"] == 0.25
    assert scores["reference"] == {"count": 3, "candidate": {"exact_match": pytest.approx(1 / 3),
                                                             "token_f1": pytest.approx(1 / 3)}}
    assert scores["per_tag"]["geo"] == {"count": 2, "exact_match": 0.5, "token_f1": 0.5}
    assert scores["per_tag"]["hard"] == {"count": 2, "exact_match": 0.0, "token_f1": 0.0}
    assert scores["latency"]["ttft_s"]["p50"] == pytest.approx(0.1)
