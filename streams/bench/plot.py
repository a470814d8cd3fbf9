"""PNG plots: latency percentiles against request rate (a sweep), else latency CDFs."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from streams.bench.stats import cdf

_PANELS = (("ttft_s", "ttft_ms", "TTFT"), ("tpot_s", "tpot_ms", "TPOT"), ("e2e_s", "e2e_ms", "end-to-end latency"))


def plot(result: dict[str, Any], path: str | Path) -> Path:
    """Write the plot of a result file's runs to ``path``; returns it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = result["runs"]
    sweep = len(runs) > 1 and all(r["load"].get("request_rate") not in (None,) for r in runs) and result.get("bus_overhead") is None
    fig, axes = plt.subplots(1, len(_PANELS), figsize=(5 * len(_PANELS), 4), constrained_layout=True)
    if sweep:
        rates = [_rate(r) for r in runs]
        for ax, (_, key, name) in zip(axes, _PANELS):
            for stat, style in (("p50", "o-"), ("p90", "s--"), ("p99", "^:")):
                ys = [r[key].get(stat) for r in runs]
                ax.plot(rates, [math.nan if y is None else y for y in ys], style, label=stat)
            ax.set_xlabel("request rate (req/s)")
            ax.set_ylabel(f"{name} (ms)")
            ax.set_title(name)
            ax.grid(True, alpha=0.3)
            ax.legend()
        fig.suptitle(f"specstream bench sweep: {runs[0]['backend'].get('backend')}")
    else:
        for ax, (field, _, name) in zip(axes, _PANELS):
            for run in runs:
                values = [p[field] * 1000 for p in run.get("per_request", []) if p.get("ok") and p.get(field) is not None]
                if values:
                    xs, ys = cdf(values)
                    ax.step(xs, ys, where="post", label=run["label"] or run["backend"].get("backend"))
            ax.set_xlabel(f"{name} (ms)")
            ax.set_ylabel("fraction of requests")
            ax.set_ylim(0, 1.02)
            ax.set_title(f"{name} CDF")
            ax.grid(True, alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend()
        fig.suptitle("specstream bench")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _rate(run: dict[str, Any]) -> float:
    rate = run["load"].get("request_rate")
    if rate == "inf" or rate is None:
        achieved = run["schedule"].get("achieved_send_rate")
        return achieved if achieved else math.nan
    return float(rate)
