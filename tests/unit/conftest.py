"""tests/unit is the fast tier: no broker, no server, no real model's weights (tiny random models and the default
model's tokenizer are fine). A test that needs more lives in tests/integration; collecting one here is an error
that names it, so the folder always says the tier."""
from __future__ import annotations

from pathlib import Path

import pytest

UNIT = Path(__file__).parent
# Marks and fixtures that bring up a broker, a server or the real model (tests/conftest.py, tests/kafka_fixtures.py).
SLOW_MARKS = ("kafka", "model", "cluster")
SLOW_FIXTURES = frozenset({"kafka_bootstrap", "kafka_single", "kafka_cluster", "kafka_cluster_session",
                           "worker_harness", "reply_inbox", "redis_url"})


def tier_violation(item: pytest.Item) -> str | None:
    """Why ``item`` may not run in the unit tier, or None."""
    marks = [name for name in SLOW_MARKS if item.get_closest_marker(name) is not None]
    fixtures = sorted(SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())))
    if not marks and not fixtures:
        return None
    return f"{item.nodeid}: " + ", ".join([f"marked {m}" for m in marks] + [f"uses {f}" for f in fixtures])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    del config
    wrong = [why for item in items if UNIT in item.path.parents and (why := tier_violation(item))]
    if wrong:
        raise pytest.UsageError("tests/unit is the fast tier (no broker, server or real model); move these to "
                                "tests/integration:\n  " + "\n  ".join(wrong))
