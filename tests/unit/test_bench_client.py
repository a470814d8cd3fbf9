"""The benchmark's client side against a scripted fake server: timing, stream checks, error kinds, load shapes,
the result file and `bench compare`. The fake (streams.bench.fake_server) is not specstream; the real stack is
exercised in tests/stacks/test_bench_serve.py."""
from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path

import pytest

from streams.bench.backends.base import Backend, BackendOptions
from streams.bench.backends.openai_http import OpenAIBackend
from streams.commands.bench import main
from streams.bench.fake_server import FakeOpenAIServer, FakeOptions, closed_port, fake_server_in_thread
from streams.bench.record import RequestRecord, StreamChecker
from streams.bench.report import bus_overhead, run_result
from streams.bench.runner import LoadSpec, run_load
from streams.bench.workload import LengthSpec, synthetic, take

pytestmark = pytest.mark.timeout(60)


async def _run(mode: str, n: int = 3, fake: FakeOptions | None = None, **load: object) -> dict:
    server = FakeOpenAIServer(fake)
    await server.start()
    try:
        backend = OpenAIBackend(BackendOptions(model=mode, base_url=server.base_url))
        spec = LoadSpec(**{"concurrency": 2, "num_requests": n, "timeout_s": 2.0, **load})  # type: ignore[arg-type]
        async with backend:
            outcome = await run_load(backend, synthetic("chat", LengthSpec(output_len=8), seed=0), spec)
        return run_result(outcome, {"ttft": 0.5}, backend.describe())
    finally:
        await server.stop()


async def test_good_streams_are_measured() -> None:
    result = await _run("ok", n=4, fake=FakeOptions(chunks=5, delay_s=0.01, tokens_per_chunk=2))
    assert result["requests"] == {"total": 4, "completed": 4, "failed": 0, "warmup": 0, "warmup_failed": 0}
    assert result["errors"]["total"] == 0
    assert result["tokens"]["output"] == 4 * 10
    ttft, e2e = result["ttft_ms"], result["e2e_ms"]
    assert 5 <= ttft["p50"] < e2e["p50"]
    assert e2e["p50"] >= 50  # 6 delays of 10 ms
    assert result["itl_ms"]["count"] == 4 * (5 - 1) * 2  # one value per token after the first chunk
    assert result["itl_ms"]["p50"] == pytest.approx(result["inter_chunk_ms"]["p50"] / 2, rel=0.5)
    assert result["spec"]["acceptance_rate"] == pytest.approx(0.25)
    assert result["spec"]["mean_accepted_length"] == pytest.approx(2.0)
    assert result["goodput"]["good"] == 4
    assert result["output_throughput"] == pytest.approx(40 / result["duration_s"])


@pytest.mark.parametrize(
    ("mode", "kind"),
    [
        ("http500", "http_500"),
        ("repeat", "protocol:repeat"),
        ("no_done", "protocol:missing_done"),
        ("mid_error", "error:internal_error"),
        ("hang", "timeout"),
    ],
)
async def test_broken_streams_are_errors_not_fast_requests(mode: str, kind: str) -> None:
    result = await _run(mode, n=2, timeout_s=0.5)
    assert result["requests"]["completed"] == 0 and result["requests"]["failed"] == 2
    assert result["errors"]["by_kind"] == {kind: 2}
    assert result["ttft_ms"]["count"] == 0 and result["e2e_ms"]["count"] == 0
    assert result["goodput"]["good"] == 0 and result["goodput"]["fraction"] == 0
    assert result["request_throughput"] == 0


async def test_unreachable_server_is_connect_errors() -> None:
    backend = OpenAIBackend(BackendOptions(base_url=f"http://127.0.0.1:{closed_port()}"))
    async with backend:
        outcome = await run_load(backend, synthetic("chat", LengthSpec(), seed=0), LoadSpec(concurrency=2, num_requests=3))
    result = run_result(outcome, {}, backend.describe())
    assert result["errors"]["by_kind"] == {"connect": 3}
    assert result["requests"]["completed"] == 0


class _Sleepy(Backend):
    """Answers every request with 2 chunks after a fixed delay; records when each was sent."""

    name = "sleepy"

    def __init__(self, delay: float) -> None:
        super().__init__(BackendOptions())
        self.delay = delay
        self.sent: list[float] = []
        self.in_flight = 0
        self.max_in_flight = 0

    async def run(self, record: RequestRecord, checker: StreamChecker) -> None:
        record.start = time.perf_counter()
        self.sent.append(record.start)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay / 2)
            checker.chunk(time.perf_counter(), text="a", token_ids=[1], index=0)
            await asyncio.sleep(self.delay / 2)
            checker.chunk(time.perf_counter(), text="b", token_ids=[2], index=1)
            checker.final(time.perf_counter(), finish_reason="length", num_chunks=2, text="ab", completion_tokens=2)
        finally:
            self.in_flight -= 1


async def test_closed_loop_keeps_concurrency_and_excludes_warmup() -> None:
    backend = _Sleepy(0.02)
    warm = take(synthetic("chat", LengthSpec(), seed=99), 3)
    outcome = await run_load(backend, synthetic("chat", LengthSpec(), seed=0), LoadSpec(concurrency=3, num_requests=9),
                             warmup_requests=warm)
    assert len(outcome.records) == 9 and len(outcome.warmup_records) == 3
    assert backend.max_in_flight == 3
    assert all(not r.warmup for r in outcome.records)
    assert min(r.start for r in outcome.records) >= outcome.t0  # warmup happened before the measured window
    assert [r.request.index for r in outcome.records] == list(range(9))


async def test_open_loop_follows_seeded_schedule() -> None:
    from streams.bench.arrivals import arrival_times

    backend = _Sleepy(0.01)
    spec = LoadSpec(rate=50.0, num_requests=12, seed=4)
    outcome = await run_load(backend, synthetic("chat", LengthSpec(), seed=0), spec)
    expected = arrival_times(12, 50.0, seed=4)
    assert [r.scheduled_s for r in outcome.records] == pytest.approx(expected)
    # Sent at (never before) the scheduled time; how late depends on the machine, and is recorded as lag.
    for r in outcome.records:
        assert r.start - outcome.t0 >= r.scheduled_s
    assert len(outcome.schedule_lag) == 12 and min(outcome.schedule_lag) >= 0
    assert sorted(outcome.schedule_lag)[6] < 0.5


async def test_open_loop_duration_and_max_concurrency() -> None:
    backend = _Sleepy(0.05)
    spec = LoadSpec(rate=math.inf, duration_s=0.2, max_concurrency=2, seed=0)
    outcome = await run_load(backend, synthetic("chat", LengthSpec(), seed=0), spec)
    assert backend.max_in_flight == 2
    assert 2 <= len(outcome.records) <= 12
    assert all(r.ok for r in outcome.records)


def test_bus_overhead_is_the_added_latency_and_the_throughput_ratio_against_the_baseline() -> None:
    def run(label: str, ttft50: float, ttft99: float, tput: float) -> dict:
        lat = {"mean": ttft50, "p50": ttft50, "p99": ttft99}
        return {"label": label, "ttft_ms": lat, "itl_ms": lat, "tpot_ms": lat, "e2e_ms": lat,
                "output_throughput": tput, "request_throughput": tput / 10}

    out = bus_overhead(run("openai", 14.0, 60.0, 96.0), run("inprocess", 10.0, 40.0, 100.0))
    assert out["added_ttft_ms"]["p50"] == pytest.approx(4.0)
    assert out["added_ttft_ms"]["p99"] == pytest.approx(20.0)
    assert out["output_throughput_ratio"] == pytest.approx(0.96)
    assert out["targets"]["added_ttft_p50_ms<=5"] and out["targets"]["throughput_ratio>=0.95"]


def test_cli_runs_write_json_and_plots_with_the_same_prompts_per_seed_and_compare_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    with fake_server_in_thread(FakeOptions(chunks=3, delay_s=0.002)) as server:
        common = ["--backend", "openai", "--base-url", server.base_url, "--model", "ok", "--num-requests", "4",
                  "--output-len", "8", "--warmup", "1", "--no-progress", "--seed", "3", "--slo", "ttft=500ms,e2e=5s"]
        assert main([*common, "--concurrency", "2", "--out", str(a)]) == 0
        assert main([*common, "--sweep-rates", "50,100", "--out", str(b)]) == 0
        prompts = [json.dumps(r["messages"]) for r in server.requests]
    # The same seed sends the same prompts in every run and every rate. Their order is the workload's
    # (test_bench_workload); here two in flight at once may reach the server in either order.
    first = sorted(prompts[1:5])
    assert sorted(prompts[6:10]) == first and sorted(prompts[10:14]) == first
    data = json.loads(a.read_text())
    assert data["schema"] == "specstream.bench/1"
    run = data["runs"][0]
    assert run["requests"]["completed"] == 4 and run["requests"]["warmup"] == 1
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert set(run[key]) >= {"mean", "p50", "p90", "p99"}
    assert run["goodput"]["slo_ms"] == {"ttft": 500.0, "e2e": 5000.0}
    assert len(run["per_request"]) == 4
    assert a.with_suffix(".png").stat().st_size > 1000
    sweep = json.loads(b.read_text())
    assert [r["load"]["request_rate"] for r in sweep["runs"]] == [50.0, 100.0]
    assert b.with_suffix(".png").stat().st_size > 1000
    capsys.readouterr()
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "B/A" in out and "TTFT p99" in out
    assert main(["compare", str(a), str(b), "--json"]) == 0
    ratios = json.loads(capsys.readouterr().out)
    assert ratios[0]["request throughput (req/s)"]["ratio"] > 0


def test_cli_failing_server_exit_status(tmp_path: Path) -> None:
    out = tmp_path / "fail.json"
    args = ["--base-url", f"http://127.0.0.1:{closed_port()}", "--concurrency", "2", "--num-requests", "3",
            "--warmup", "0", "--no-progress", "--out", str(out), "--plot", "none"]
    assert main(args) == 1  # nothing completed
    run = json.loads(out.read_text())["runs"][0]
    assert run["errors"]["by_kind"] == {"connect": 3}
    assert run["ttft_ms"]["p50"] is None


def test_cli_refuses_a_bad_slo_missing_results_and_conflicting_load_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--slo", "latency=5s", "--no-progress"]) == 2
    assert main(["compare", "/nonexistent/a.json", "/nonexistent/b.json"]) == 2
    with pytest.raises(SystemExit):
        main(["--concurrency", "2", "--request-rate", "3"])


async def test_alternating_rounds_merge_per_backend_and_pair_requests_for_differences() -> None:
    from streams.bench.report import paired_differences
    from streams.bench.runner import merge_outcomes

    fast, slow = _Sleepy(0.01), _Sleepy(0.1)
    reqs = take(synthetic("mixed", LengthSpec(), seed=0), 6)
    outs: dict[str, list] = {"fast": [], "slow": []}
    for r, part in enumerate((reqs[:3], reqs[3:])):
        for name, backend in ((("fast", fast), ("slow", slow)) if r % 2 == 0 else (("slow", slow), ("fast", fast))):
            outs[name].append(await run_load(backend, iter(part), LoadSpec(concurrency=3, num_requests=len(part))))
    a, b = merge_outcomes("slow", outs["slow"]), merge_outcomes("fast", outs["fast"])
    assert [r.request.index for r in a.records] == list(range(6))
    # Throughput counts only the measured windows, not the other backend's rounds in between.
    assert a.duration_s < a.t1 - a.t0
    paired = paired_differences(a.records, b.records)
    assert paired["pairs"] == 6 and paired["same_output_tokens"] == 6
    # Nominally +90 ms end to end and +45 ms to the first token; sleeps only ever overshoot, on a busy machine by more.
    assert 0 < paired["e2e_ms"]["p50"] and 0 < paired["ttft_ms"]["p50"] < paired["e2e_ms"]["p50"]
    overhead = bus_overhead(run_result(a, {}, {}), run_result(b, {}, {}), a.records, b.records, rounds=2)
    assert overhead["paired"]["pairs"] == 6 and overhead["rounds"] == 2
    assert overhead["targets"]["added_e2e_p50_ms<=5"] is False


def test_cli_unreachable_kafka_is_connect_errors(tmp_path: Path) -> None:
    out = tmp_path / "kafka.json"
    args = ["--backend", "kafka", "--bootstrap-servers", f"127.0.0.1:{closed_port()}", "--concurrency", "2",
            "--num-requests", "3", "--warmup", "0", "--no-progress", "--out", str(out), "--plot", "none"]
    assert main(args) == 1
    run = json.loads(out.read_text())["runs"][0]
    assert run["errors"]["by_kind"] == {"connect": 3}
    assert "could not start" in run["errors"]["examples"]["connect"]


class _FakeWs:
    """A scripted /v1/ws: the request's model picks the script (ok, gap, error, close)."""

    def __init__(self) -> None:
        self.port = 0
        self.server = None

    async def __aenter__(self) -> "_FakeWs":
        from websockets.asyncio.server import serve

        self.server = await serve(self._handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def _handle(self, ws) -> None:  # type: ignore[no-untyped-def]
        async for raw in ws:
            req = json.loads(raw)
            asyncio.create_task(self._answer(ws, req))

    async def _answer(self, ws, req: dict) -> None:  # type: ignore[no-untyped-def]
        rid, mode = req["id"], req["model"]
        if mode == "error":
            await ws.send(json.dumps({"type": "error", "id": rid, "code": "overloaded", "message": "busy", "status": 503}))
            return
        indices = [0, 2] if mode == "gap" else [0, 1]
        for i in indices:
            await asyncio.sleep(0.005)
            await ws.send(json.dumps({"type": "chunk", "id": rid, "index": i, "text": f"t{i}", "token_ids": [i, i],
                                      "spec": {"drafted": 3, "accepted": 1}}))
            if mode == "close":
                await ws.close()
                return
        await ws.send(json.dumps({"type": "done", "id": rid, "text": "".join(f"t{i}" for i in indices),
                                  "finish_reason": "length", "num_chunks": len(indices),
                                  "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
                                  "timings": {"queued_s": 0, "ttft_s": 0.001, "total_s": 0.01},
                                  "spec": {"drafted": 6, "accepted": 2}}))


@pytest.mark.parametrize(("mode", "kinds"), [("ok", {}), ("gap", {"protocol:gap": 4}), ("error", {"error:overloaded": 4}),
                                             ("close", {"disconnect": 4})])
async def test_the_websocket_backend_counts_completions_gaps_errors_and_disconnects(mode: str, kinds: dict) -> None:
    from streams.bench.backends.websocket import WebSocketBackend

    async with _FakeWs() as fake:
        backend = WebSocketBackend(BackendOptions(model=mode, base_url=f"http://127.0.0.1:{fake.port}", ws_connections=2))
        async with backend:
            outcome = await run_load(backend, synthetic("chat", LengthSpec(), seed=0),
                                     LoadSpec(concurrency=4, num_requests=4, timeout_s=5))
    result = run_result(outcome, {}, backend.describe())
    assert result["errors"]["by_kind"] == kinds
    if mode == "ok":
        assert result["requests"]["completed"] == 4 and result["tokens"]["output"] == 16
        assert result["client_minus_server_ttft_ms"]["count"] == 4
        assert result["spec"]["mean_accepted_length"] == pytest.approx(2.0)


def test_cli_dataset_uses_completions(tmp_path: Path) -> None:
    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "Once upon a time"}\n{"prompt": "In a hole in the ground", "max_tokens": 5}\n')
    out = tmp_path / "d.json"
    with fake_server_in_thread(FakeOptions(chunks=2, delay_s=0.001)) as server:
        assert main(["--base-url", server.base_url, "--model", "ok", "--dataset", str(data), "--concurrency", "1",
                     "--num-requests", "4", "--warmup", "0", "--no-progress", "--out", str(out), "--plot", "none"]) == 0
        assert {r["prompt"] for r in server.requests} == {"Once upon a time", "In a hole in the ground"}
        assert all(r["stream"] and r["stream_options"] == {"include_usage": True} for r in server.requests)
    run = json.loads(out.read_text())["runs"][0]
    assert run["requests"]["completed"] == 4 and run["per_request"][0]["workload"] == "p"
