"""Keep Python's full garbage collections short in long-running services.

A worker holds millions of long-lived Python objects after start (the model's
modules, the tokenizer's tables, transformers and torch themselves). CPython's
oldest-generation collection walks all of them, and it stops every thread: in
the engine worker one took 220-320 ms, ten times in a six-minute load, and an
interactive request arriving then waited that much longer for its first token
(it was issue 18's p99 tail; 54e26a1:docs/benchmarks.md). Freezing the heap once start
is done moves those objects out of the collector's sight (``gc.freeze``, the
standard remedy), so later full collections walk only what was allocated since.
"""
from __future__ import annotations

import gc
import logging

log = logging.getLogger("specstream.service")


def freeze_startup_heap(name: str) -> int:
    """Collect start-up garbage, then freeze what survives; returns the objects now frozen."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("%s: %d start-up objects frozen out of garbage collection", name, frozen)
    return frozen
