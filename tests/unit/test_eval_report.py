"""The report files of `specstream eval`: JSON as computed, a PNG plot, an HTML page that shows texts safely."""
from __future__ import annotations

import json
from pathlib import Path

from schemas.events import Completion, Timings, Usage
from streams.eval.compare import compare
from streams.eval.gates import GateResult, gate_section
from streams.eval.outcome import Outcome, Pair
from streams.eval.report import write_reports


def _outcome(text: str) -> Outcome:
    return Outcome.of(Completion(request_id="r", text=text, finish_reason="length", num_chunks=1,
                                 usage=Usage(prompt_tokens=1, completion_tokens=3, total_tokens=4),
                                 timings=Timings(queued_s=0.0, ttft_s=0.1, total_s=0.3)))


def test_reports_are_the_json_a_plot_and_a_page_with_gates_and_escaped_texts(tmp_path: Path) -> None:
    pairs = [Pair("r1", _outcome("<script>x</script>"), _outcome("<script>y</script>"))]
    report = {"kind": "replay", "scores": compare(pairs),
              "gates": gate_section([GateResult("min-exact-match", 0.99, 0.0, False)])}
    written = write_reports(report, tmp_path / "out")
    assert [p.name for p in written] == ["report.json", "summary.png", "report.html"]
    assert json.loads(written[0].read_text()) == json.loads(json.dumps(report))
    assert written[1].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = written[2].read_text()
    assert "gates FAILED" in page and "--min-exact-match" in page and 'class=fail' in page
    assert "<script>" not in page and "&lt;script&gt;x&lt;/script&gt;" in page
