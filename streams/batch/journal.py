"""The assembler's durable record of a batch's answered lines: one JSON line per custom_id, appended and synced
before the answer's offset is committed.

So an assembler killed at any point loses nothing (what was committed is in the journal) and writes nothing
twice (an answer redelivered after the restart, or regenerated after a worker crash, finds its custom_id here and
is counted as a duplicate). A torn last line (killed mid-write) is ignored on load: its answer was not committed,
so it comes again.
"""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from streams.batch.outputs import LineOutcome

log = logging.getLogger(__name__)


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.outcomes: dict[str, LineOutcome] = {}  # by custom_id
        self.duplicates = 0
        if path.exists():
            self._load()

    def _load(self) -> None:
        text = self.path.read_text(encoding="utf-8")
        if text and not text.endswith("\n"):
            # Killed mid-write: cut the torn tail, so the next line starts on a line of its own.
            text = text[:text.rfind("\n") + 1]
            with self.path.open("r+", encoding="utf-8") as out:
                out.truncate(len(text.encode("utf-8")))
        for raw in text.splitlines():
            try:
                item = json.loads(raw)
                outcome = LineOutcome(int(item["line"]), item["record"]["custom_id"], item["outcome"], item["record"])
            except (ValueError, KeyError, TypeError):
                log.warning("journal %s: ignoring a torn or unreadable line", self.path)
                continue
            self.outcomes.setdefault(outcome.custom_id, outcome)

    def add(self, outcome: LineOutcome) -> bool:
        """Record an answer; False (and nothing written) when its custom_id was answered already."""
        if outcome.custom_id in self.outcomes:
            self.duplicates += 1
            return False
        line = json.dumps({"line": outcome.line, "outcome": outcome.outcome, "record": outcome.record},
                          separators=(",", ":"), ensure_ascii=False)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as out:
            out.write(line + "\n")
            out.flush()
            os.fsync(out.fileno())
        self.outcomes[outcome.custom_id] = outcome
        return True

    def count(self, *outcomes: str) -> int:
        return sum(1 for o in self.outcomes.values() if o.outcome in outcomes)

    def in_order(self) -> Iterator[LineOutcome]:
        """Outcomes in input-file order (OpenAI does not promise an order; the input's is the useful one)."""
        return iter(sorted(self.outcomes.values(), key=lambda o: o.line))
