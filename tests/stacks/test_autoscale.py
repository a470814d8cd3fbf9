"""`specstream autoscale` on real workers: a burst brings a second worker, the quiet after it takes it away.

An edge (no worker of its own) and the autoscaler (min 1, max 2, 4 requests per worker, a 20 s scale-down window)
run on a topic prefix of their own with two request partitions. The autoscaler starts the first worker; a burst of
16 requests through the edge's websocket (each worker runs one at a time and holds at most 4) leaves lag in Kafka,
so the autoscaler starts a second worker, which loads the model while the first works through the backlog, then
joins the group and takes a partition. Once the backlog is answered and
the window has passed, the autoscaler drains the second worker (SIGTERM: it finishes, commits, leaves and exits 0).
Every client gets its whole answer exactly once through both rebalances.
"""
from __future__ import annotations

import asyncio
import re
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from streams.testing.reliability import PROMPTS, WORKER_ENV, chat_body, run_ws
from streams.testing.stack import DEFAULT_MODEL, Process, Stack, running_stack, spawn_process, wait_ready
from tests.kafka_fixtures import kafka_bootstrap, kafka_single  # noqa: F401

pytestmark = [pytest.mark.kafka, pytest.mark.model]

BURST = 16
MAX_TOKENS = 32
ENV = {**WORKER_ENV, "SPECSTREAM_KAFKA__REQUEST_PARTITIONS": "2", "SPECSTREAM_WORKER__MAX_INFLIGHT": "4",
       "SPECSTREAM_ENGINE__MAX_RUNNING_REQUESTS": "1", "SPECSTREAM_WORKER__DRAIN_TIMEOUT_S": "20"}
# The window outlasts the second worker's start on a busy machine (beside other test processes, the int4 worker
# answered the burst and was told to leave before it had joined the group).
WINDOW_S = 20
AUTOSCALE = ["autoscale", "--min", "1", "--max", "2", "--lag-threshold", "4", "--scale-down-window", str(WINDOW_S),
             "--interval", "1"]


def _wait_for_line(process: Process, pattern: str, timeout_s: float, *also: Process) -> re.Match[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        match = re.search(pattern, process.log.read_text(errors="replace"), re.MULTILINE)
        if match:
            return match
        if process.popen.poll() is not None:
            break
        time.sleep(0.5)
    tails = "\n".join(f"--- {p.name} ---\n{p.tail(60)}" for p in (process, *also))
    raise AssertionError(f"no line matching {pattern!r} within {timeout_s:.0f} s:\n{tails}")


@pytest.fixture(scope="module")
def autoscaled(kafka_bootstrap: str) -> Iterator[tuple[Stack, Process, Path]]:  # noqa: F811
    with tempfile.TemporaryDirectory(prefix="specstream-autoscale-") as logs, \
            running_stack(kafka_bootstrap, worker=False, env=ENV, log_dir=logs) as stack:
        scaler = spawn_process("autoscale", [*AUTOSCALE, "--log-dir", logs], stack.env, Path(logs))
        stack.processes.insert(0, scaler)  # stopped after the edge: SIGTERM drains its workers
        wait_ready(stack, 300)
        yield stack, scaler, Path(logs)


def test_a_burst_starts_a_second_worker_and_the_quiet_after_it_drains_that_worker(
        autoscaled: tuple[Stack, Process, Path]) -> None:
    stack, scaler, logs = autoscaled
    bodies = [chat_body(f"b{i}", PROMPTS[i % len(PROMPTS)], model=DEFAULT_MODEL, max_tokens=MAX_TOKENS)
              for i in range(BURST)]
    sent_at = time.monotonic()
    answers = asyncio.run(run_ws(stack.ws_url, stack.api_key, bodies, timeout_s=300))
    answered_s = time.monotonic() - sent_at

    problems = {tag: a.problems() for tag, a in answers.items() if a.problems()}
    assert not problems, f"{problems}\n{scaler.tail(60)}"
    assert len(answers) == BURST

    up = _wait_for_line(scaler, r"^scale 1 -> 2: load (\d+)", 10)
    assert int(up.group(1)) > 4
    second = _wait_for_line(scaler, r"^(autoscale-\d+-2): started", 10).group(1)
    # It joined the group and was given a request partition (two partitions, two workers: one each).
    _wait_for_line(Process(second, scaler.popen, logs / f"{second}.log"), r"assigned \S+\.requests/\d", 120, scaler)

    down = _wait_for_line(scaler, rf"^scale 2 -> 1: load \d+ has asked for at most 1 for {WINDOW_S} s", 120)
    assert down
    _wait_for_line(scaler, rf"^{second} \(pid \d+\) drained: exited with status 0", 60)
    print(f"burst of {BURST} answered in {answered_s:.1f} s")

    scaler.popen.send_signal(signal.SIGTERM)
    assert scaler.popen.wait(60) == 0
    assert re.search(r"^autoscale-\d+-1 \(pid \d+\) drained: exited with status 0", scaler.tail(20), re.MULTILINE)
