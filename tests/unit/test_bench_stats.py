"""Statistics of `specstream bench`: percentiles, SLO parsing, goodput, arrivals. No model, no server."""
from __future__ import annotations

import math
import statistics

import pytest

from streams.bench import arrivals
from streams.bench.stats import cdf, goodput, meets_slo, parse_duration_s, parse_slo, percentile, summarize


class TestPercentile:
    def test_linear_interpolation_matches_numpy_default(self) -> None:
        np = pytest.importorskip("numpy")
        data = [5.0, 1.0, 9.0, 3.0, 7.0, 2.0, 8.0]
        for q in (0, 10, 25, 50, 90, 99, 100):
            assert percentile(data, q) == pytest.approx(float(np.percentile(data, q)))

    def test_percentiles_of_small_lists_interpolate_between_ranks(self) -> None:
        assert percentile([1, 2, 3, 4], 50) == 2.5
        assert percentile([1, 2, 3, 4], 0) == 1
        assert percentile([1, 2, 3, 4], 100) == 4
        assert percentile(list(range(1, 101)), 99) == pytest.approx(99.01)
        assert percentile([7.0], 99) == 7.0

    def test_empty_is_nan_and_bad_q_raises(self) -> None:
        assert math.isnan(percentile([], 50))
        with pytest.raises(ValueError):
            percentile([1.0], 101)

    def test_a_summary_is_scaled_and_its_percentiles_are_ordered(self) -> None:
        s = summarize([0.010, 0.020, 0.030, 0.040], scale=1000)
        assert s["count"] == 4
        assert s["mean"] == pytest.approx(25.0)
        assert s["p50"] == pytest.approx(25.0)
        assert s["min"] <= s["p50"] <= s["p90"] <= s["p99"] <= s["max"]
        assert s["std"] == pytest.approx(statistics.pstdev([10, 20, 30, 40]))

    def test_summarize_empty_gives_nulls(self) -> None:
        s = summarize([])
        assert s["count"] == 0 and s["mean"] is None and s["p99"] is None


class TestSlo:
    def test_an_slo_lists_metrics_with_durations_in_any_unit(self) -> None:
        assert parse_slo("ttft=500ms,e2e=5s") == {"ttft": 0.5, "e2e": 5.0}
        assert parse_slo("tpot:50, itl=200ms") == {"tpot": 0.05, "itl": 0.2}
        assert parse_slo(None) == {} and parse_slo("") == {}
        assert parse_duration_s("250us") == pytest.approx(0.00025)

    @pytest.mark.parametrize("bad", ["latency=5s", "ttft", "ttft=fast", "ttft=0ms", "ttft=-1s"])
    def test_an_unknown_metric_or_a_missing_bad_or_non_positive_duration_is_rejected(self, bad: str) -> None:
        with pytest.raises(ValueError):
            parse_slo(bad)

    def test_meets_slo_needs_every_metric_known(self) -> None:
        slo = {"ttft": 0.5, "e2e": 5.0}
        assert meets_slo({"ttft": 0.4, "e2e": 4.0}, slo)
        assert not meets_slo({"ttft": 0.6, "e2e": 4.0}, slo)
        assert not meets_slo({"ttft": None, "e2e": 4.0}, slo)  # no first token: not good
        assert meets_slo({"ttft": 0.5, "e2e": 5.0}, slo)  # bounds are inclusive

    def test_goodput_counts_failures_in_the_denominator_only(self) -> None:
        ok = [{"ttft": 0.1, "e2e": 1.0}, {"ttft": 0.9, "e2e": 1.0}, {"ttft": 0.2, "e2e": 6.0}, {"ttft": 0.3, "e2e": 2.0}]
        out = goodput(ok, failures=4, slo={"ttft": 0.5, "e2e": 5.0}, duration_s=2.0)
        assert out.good == 2 and out.total == 8
        assert out.goodput == pytest.approx(1.0)
        assert out.fraction == pytest.approx(0.25)

    def test_goodput_without_slo_is_success_rate(self) -> None:
        out = goodput([{"ttft": 9.0}] * 3, failures=1, slo={}, duration_s=3.0)
        assert out.good == 3 and out.goodput == pytest.approx(1.0) and out.fraction == pytest.approx(0.75)

    def test_the_cdf_sorts_the_values_and_climbs_to_one(self) -> None:
        xs, ys = cdf([3.0, 1.0, 2.0, 4.0])
        assert xs == [1.0, 2.0, 3.0, 4.0] and ys == [0.25, 0.5, 0.75, 1.0]


class TestArrivals:
    def test_arrival_times_are_reproducible_with_a_seed_and_never_decrease(self) -> None:
        a = arrivals.arrival_times(50, rate=4.0, seed=7)
        b = arrivals.arrival_times(50, rate=4.0, seed=7)
        c = arrivals.arrival_times(50, rate=4.0, seed=8)
        assert a == b
        assert a != c
        assert a[0] == 0.0 and all(y >= x for x, y in zip(a, a[1:]))

    def test_poisson_gaps_have_the_rates_mean_and_a_coefficient_of_variation_of_one(self) -> None:
        gaps = [g for g, _ in zip(arrivals.gaps(rate=5.0, burstiness=1.0, seed=1), range(20000))]
        mean = statistics.fmean(gaps)
        assert mean == pytest.approx(0.2, rel=0.03)
        # Exponential gaps: standard deviation equals the mean (coefficient of variation 1).
        assert statistics.pstdev(gaps) / mean == pytest.approx(1.0, rel=0.05)

    def test_burstiness_changes_spread_not_mean(self) -> None:
        def cv(b: float) -> tuple[float, float]:
            g = [x for x, _ in zip(arrivals.gaps(rate=2.0, burstiness=b, seed=3), range(20000))]
            m = statistics.fmean(g)
            return m, statistics.pstdev(g) / m

        bursty_mean, bursty_cv = cv(0.25)
        even_mean, even_cv = cv(4.0)
        assert bursty_mean == pytest.approx(0.5, rel=0.06) and even_mean == pytest.approx(0.5, rel=0.03)
        assert bursty_cv == pytest.approx(2.0, rel=0.1)  # cv of gamma = 1/sqrt(shape)
        assert even_cv == pytest.approx(0.5, rel=0.05)

    def test_infinite_rate_sends_all_at_once(self) -> None:
        assert arrivals.arrival_times(5, rate=math.inf) == [0.0] * 5

    def test_rates_parse_as_a_list_with_inf_and_non_positive_or_nan_rates_are_rejected(self) -> None:
        assert arrivals.parse_rates("1,2,4") == [1.0, 2.0, 4.0]
        assert math.isinf(arrivals.parse_rate("inf"))
        for bad in ("0", "-1", "nan"):
            with pytest.raises(ValueError):
                arrivals.parse_rate(bad)
