"""`specstream bench` against the real stack: Kafka, a `specstream worker` subprocess on the default model and
an edge subprocess (streams/testing/stack.py). Short runs (4 requests, 16 tokens) through every door, the in-process
baseline, the compare command, and failing servers reported as errors."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from streams.commands.bench import main
from streams.bench.fake_server import FakeOptions, closed_port, fake_server_in_thread
from streams.testing.stack import Stack, running_stack
from tests.kafka_fixtures import kafka_bootstrap, kafka_single  # noqa: F401  (pytest fixtures)

pytestmark = [pytest.mark.kafka, pytest.mark.model, pytest.mark.timeout(300)]

NUM = 4
TOKENS = 16


@pytest.fixture(scope="module")
def stack(kafka_bootstrap: str) -> Iterator[Stack]:  # noqa: F811
    # Prompt lookup drafts on every step: the adaptive controller fits its step costs to measured times, and beside
    # other test processes it once judged drafting not worth it for all four requests (`drafted` 0). This module
    # checks that the bench reports speculation, not when the controller speculates.
    with running_stack(kafka_bootstrap, env={"SPECSTREAM_ENGINE__SPECULATION__ADAPTIVE": "false"}) as s:
        yield s


def _args(stack: Stack, backend: str, out: Path, *extra: str) -> list[str]:
    return [
        "--backend", backend, "--base-url", stack.base_url, "--bootstrap-servers", stack.bootstrap_servers,
        "--topic-prefix", stack.topic_prefix, "--model", stack.model, "--concurrency", "2",
        "--num-requests", str(NUM), "--output-len", str(TOKENS), "--warmup", "1", "--seed", "11",
        "--slo", "ttft=60s,e2e=120s", "--timeout", "120", "--no-progress", "--out", str(out), "--api-key", stack.api_key,
        *extra,
    ]


def _check_run(run: dict, *, token_ids_known: bool = True) -> None:
    assert run["requests"]["total"] == NUM
    assert run["errors"] == {"total": 0, "by_kind": {}, "examples": {}}, run["errors"]
    assert run["requests"]["completed"] == NUM
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        figures = run[key]
        for stat in ("mean", "p50", "p90", "p99"):
            assert figures[stat] is not None and figures[stat] > 0, (key, stat, figures)
        assert figures["p50"] <= figures["p90"] <= figures["p99"] <= figures["max"]
    assert run["ttft_ms"]["p50"] < run["e2e_ms"]["p50"]
    assert run["tpot_ms"]["p50"] < run["e2e_ms"]["p50"]
    assert run["request_throughput"] > 0 and run["output_throughput"] > 0
    assert run["total_token_throughput"] > run["output_throughput"]
    assert run["goodput"]["good"] == NUM and run["goodput"]["requests_per_s"] == pytest.approx(run["request_throughput"])
    # The mixed workload has a code edit and a RAG answer: prompt lookup drafts for them.
    spec = run["spec"]
    assert spec["drafted"] > 0 and spec["accepted"] <= spec["drafted"]
    assert 0 <= spec["acceptance_rate"] <= 1 and spec["mean_accepted_length"] >= 1
    total = 0
    for r in run["per_request"]:
        assert r["ok"] and r["error"] is None
        assert 0 < r["ttft_s"] < r["e2e_s"]
        assert 1 <= r["output_tokens"] <= r["max_tokens"]
        assert r["prompt_tokens"] > 10 and r["text_chars"] > 0 and r["chunks"] >= 1
        if token_ids_known:
            assert r["chunks"] <= r["output_tokens"]  # one step yields at least one token
        total += r["output_tokens"]
    assert run["tokens"]["output"] == total


@pytest.fixture(scope="module")
def results(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One short run through each door (the openai one with the in-process baseline), shared by the tests below."""
    folder = tmp_path_factory.mktemp("bench")
    paths = {}
    for backend, extra in (("openai", ["--compare-inprocess"]), ("ws", ["--plot", "none"]), ("kafka", ["--plot", "none"])):
        paths[backend] = folder / f"{backend}.json"
        assert main(_args(stack, backend, paths[backend], *extra)) == 0, backend
    return paths


def test_the_openai_run_is_compared_with_the_inprocess_baseline_on_the_same_requests(results: dict[str, Path]) -> None:
    out = results["openai"]
    data = json.loads(out.read_text())
    assert data["schema"] == "specstream.bench/1"
    service, inprocess = data["runs"]
    assert service["backend"]["backend"] == "openai" and inprocess["backend"]["backend"] == "inprocess"
    _check_run(service, token_ids_known=False)
    _check_run(inprocess)
    overhead = data["bus_overhead"]
    for metric in ("added_ttft_ms", "added_e2e_ms", "added_itl_ms"):
        assert set(overhead[metric]) == {"mean", "p50", "p99"}
        assert all(isinstance(v, float) for v in overhead[metric].values())
    assert overhead["output_throughput_ratio"] > 0
    assert set(overhead["targets"]) >= {"added_ttft_p50_ms<=5", "added_ttft_p99_ms<=25", "throughput_ratio>=0.95"}
    # Same seed, same requests: both runs sent the same prompts with the same max_tokens.
    assert [r["max_tokens"] for r in service["per_request"]] == [r["max_tokens"] for r in inprocess["per_request"]]
    assert out.with_suffix(".png").stat().st_size > 1000


@pytest.mark.parametrize("backend", ["ws", "kafka"])
def test_websocket_and_kafka_runs_complete_with_server_timings(results: dict[str, Path], backend: str) -> None:
    run = json.loads(results[backend].read_text())["runs"][0]
    assert run["backend"]["backend"] == backend
    _check_run(run)
    # Server-side timings came back with every completion.
    assert run["server_ttft_ms"]["count"] == NUM


def test_compare_prints_the_ratios_of_two_results_as_a_table_or_json(
        results: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["compare", str(results["openai"]), str(results["kafka"])]) == 0
    out = capsys.readouterr().out
    assert "B/A" in out and "TTFT p50" in out and "output throughput" in out
    assert main(["compare", str(results["ws"]), str(results["kafka"]), "--json"]) == 0
    ratios = json.loads(capsys.readouterr().out)
    assert ratios[0]["TTFT p50 (ms)"]["ratio"] > 0


def test_failing_servers_are_errors(tmp_path: Path) -> None:
    common = ["--concurrency", "2", "--num-requests", "3", "--warmup", "0", "--no-progress", "--plot", "none"]
    dead = tmp_path / "dead.json"
    assert main(["--base-url", f"http://127.0.0.1:{closed_port()}", *common, "--out", str(dead)]) == 1
    run = json.loads(dead.read_text())["runs"][0]
    assert run["errors"]["by_kind"] == {"connect": 3} and run["requests"]["completed"] == 0
    assert run["ttft_ms"]["count"] == 0 and run["request_throughput"] == 0
    broken = tmp_path / "500.json"
    with fake_server_in_thread(FakeOptions()) as server:
        assert main(["--base-url", server.base_url, "--model", "http500", *common, "--out", str(broken)]) == 1
    run = json.loads(broken.read_text())["runs"][0]
    assert run["errors"]["by_kind"] == {"http_500": 3}
    assert "internal_error" in run["errors"]["examples"]["http_500"]
