"""`specstream bench` against an OpenAI-compatible door (our edge or `vllm serve`), as the stack benchmarks drive it:
closed loop, greedy, a fixed max_tokens; returns output tokens/s and TTFT p50 of the run."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from streams.testing.stack import DEFAULT_MODEL


def drive(base_url: str, api_key: str | None, workload: list[str], *, concurrency: int, requests: int,
          output_len: int, out: Path) -> dict[str, Any]:
    """One run of ``workload`` (`specstream bench` arguments: ``--workload chat`` or ``--dataset F --no-shuffle``)."""
    cmd = [sys.executable, "-m", "streams.cli", "bench", "--backend", "openai", "--base-url", base_url,
           "--model", DEFAULT_MODEL, *workload, "--concurrency", str(concurrency),
           "--num-requests", str(requests), "--output-len", str(output_len), "--output-len-jitter", "0",
           "--temperature", "0", "--plot", "none", "--no-progress", "--no-detail", "--out", str(out)]
    if api_key:
        cmd += ["--api-key", api_key]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    run = json.loads(out.read_text())["runs"][0]
    assert run["requests"]["failed"] == 0, run["errors"]
    return {"output_tok_s": run["output_throughput"], "ttft_p50_ms": run["ttft_ms"]["p50"]}
