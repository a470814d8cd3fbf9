"""The report files of `specstream eval`: report.json (always), summary.png and report.html.

The PNG shows the headline rates and the latency percentiles of both sides; the HTML page shows the same numbers,
the gates and one row per request (texts side by side where they differ), with the PNG embedded.
"""
from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

from streams.eval.compare import LATENCIES

_RATES = (("exact match", ("exact_match_rate",)), ("error rate", ("error_rate",)),
          ("finish changes", ("finish_reason_changes", "rate")), ("reference F1", ("reference", "candidate", "token_f1")),
          ("acceptance", ("speculation", "acceptance_rate")))


def write_reports(report: dict[str, Any], folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = [folder / "report.json"]
    written[0].write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    png = plot_summary(report, folder / "summary.png")
    page = folder / "report.html"
    page.write_text(html_page(report, png.name), encoding="utf-8")
    return [*written, png, page]


def _value(node: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return node


def _sides(value: Any) -> tuple[float | None, float | None]:
    """(recorded, candidate) of a measure given as a Delta dict, or (None, value) for a plain number."""
    if isinstance(value, dict):
        return value.get("recorded"), value.get("candidate")
    return None, value


def plot_summary(report: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scores = report["scores"]
    fig, (rates_ax, latency_ax) = plt.subplots(1, 2, figsize=(12, 4), constrained_layout=True)
    labels = [label for label, _ in _RATES]
    rates = [_sides(_value(scores, path)) for _, path in _RATES]
    _bars(rates_ax, labels, rates, "fraction")
    rates_ax.set_ylim(0, 1.05)
    latency_labels = [f"{name.removesuffix('_s')} p{q}" for name in LATENCIES for q in (50, 99)]
    latencies = [_ms(_sides(_value(scores, ("latency", name, f"p{q}")))) for name in LATENCIES for q in (50, 99)]
    _bars(latency_ax, latency_labels, latencies, "milliseconds")
    fig.suptitle(f"specstream eval {report['kind']}")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _ms(sides: tuple[float | None, float | None]) -> tuple[float | None, float | None]:
    return tuple(None if v is None else v * 1000 for v in sides)  # type: ignore[return-value]


def _bars(ax: Any, labels: list[str], values: list[tuple[float | None, float | None]], unit: str) -> None:
    xs = range(len(labels))
    width = 0.4
    for offset, side, name in ((-width / 2, 0, "recorded"), (width / 2, 1, "candidate")):
        ys = [math.nan if v[side] is None else v[side] for v in values]
        if not all(math.isnan(y) for y in ys):
            ax.bar([x + offset for x in xs], ys, width, label=name)
    ax.set_xticks(list(xs), labels, rotation=30, ha="right")
    ax.set_ylabel(unit)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend()


def html_page(report: dict[str, Any], png_name: str) -> str:
    scores = report["scores"]
    gates = report.get("gates", {"results": [], "passed": True})
    gate_rows = "".join(
        f"<tr><td>--{html.escape(g['gate'])}</td><td>{g['threshold']:g}</td><td>{_fmt(g['value'])}</td>"
        f"<td class={'pass' if g['passed'] else 'fail'}>{'pass' if g['passed'] else 'FAIL'}</td></tr>"
        for g in gates["results"])
    headline = "".join(f"<tr><td>{html.escape(label)}</td><td>{_fmt(_sides(_value(scores, path))[0])}</td>"
                       f"<td>{_fmt(_sides(_value(scores, path))[1])}</td></tr>" for label, path in _RATES)
    rows = "".join(_request_row(row) for row in scores.get("per_request", scores.get("per_sample", [])))
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>specstream eval {report['kind']}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:4px 8px;vertical-align:top}}.pass{{color:green}}.fail{{color:red;font-weight:bold}}
pre{{white-space:pre-wrap;max-width:40em;margin:0}}</style></head><body>
<h1>specstream eval {html.escape(report['kind'])}: gates {'passed' if gates['passed'] else 'FAILED'}</h1>
<table><tr><th>gate</th><th>threshold</th><th>value</th><th></th></tr>{gate_rows}</table>
<table><tr><th>measure</th><th>recorded</th><th>candidate</th></tr>{headline}</table>
<img src="{html.escape(png_name)}" alt="summary plot">
<h2>Requests</h2><table>{rows}</table>
<h2>Report</h2><pre>{html.escape(json.dumps({k: v for k, v in report.items() if k != 'scores'}, indent=2))}</pre>
</body></html>
"""


def _request_row(row: dict[str, Any]) -> str:
    ident = row.get("request_id") or row.get("sample_id")
    same = row.get("exact_match")
    texts = (row.get("recorded_text"), row.get("candidate_text")) if "recorded_text" in row else \
        (row.get("reference"), row.get("answer"))
    cells = "".join(f"<td><pre>{html.escape(t or '')}</pre></td>" for t in texts)
    return f"<tr><td>{html.escape(str(ident))}</td><td>{'' if same is None else ('same' if same else 'differs')}</td>{cells}</tr>"


def _fmt(value: Any) -> str:
    return "n/a" if value is None else f"{value:.4g}"
