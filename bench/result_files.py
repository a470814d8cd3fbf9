"""Where a benchmark's raw result file lands by default: ``bench/results/<UTC date>-<name>.json``, committed with
the figures it backs (docs/performance.md), so a dated file never overwrites an earlier run's."""
from __future__ import annotations

import time

RESULTS_DIR = "bench/results"


def default_out(name: str) -> str:
    return f"{RESULTS_DIR}/{time.strftime('%Y-%m-%d', time.gmtime())}-{name}.json"
