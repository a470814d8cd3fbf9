"""The chaos run's ledger: what each client flow sent and what came back, and the deployment-wide checks (dead
letters, consumer lag, memory), printed as one table; any mismatch fails the run."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class FlowContext:
    """What a client flow needs to reach the deployment."""

    base_urls: list[str]  # the edges' http://host:port, the flows spread over them
    api_key: str
    bootstrap: str
    topic_prefix: str
    model: str
    env: dict[str, str]  # the services' SPECSTREAM_* environment (for a `python -m streams.cli ...` child)
    log_dir: Path

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    def base_url(self, n: int) -> str:
        return self.base_urls[n % len(self.base_urls)]


@dataclass
class Tally:
    """One row of the ledger. Every accepted item ends in exactly one of complete / errors / cancelled / dropped;
    lost, doubled and wrong are failures."""

    flow: str
    accepted: int = 0
    complete: int = 0
    errors: int = 0  # one explicit error at the client (an error frame, a 4xx/5xx, an error line)
    cancelled: int = 0  # the client cancelled it
    dropped: int = 0  # its connection closed with an edge fault on that edge (the client saw the socket close)
    lost: int = 0  # no answer and no error
    doubled: int = 0  # more than one answer, or a repeated / missing chunk
    wrong: int = 0  # an answer that is not the right one (text, chunk count, search, output line)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.doubled == 0 and self.wrong == 0 and self.accepted > 0

    def note(self, line: str) -> None:
        if len(self.notes) < 8:
            self.notes.append(line)


@dataclass
class Check:
    """A deployment-wide check: dead letters, lag, memory."""

    name: str
    ok: bool
    detail: str


COLUMNS = ("flow", "accepted", "complete", "errors", "cancelled", "dropped", "lost", "doubled", "wrong", "ok")


def table(tallies: list[Tally], checks: list[Check]) -> str:
    rows = [COLUMNS] + [(t.flow, *(str(getattr(t, c)) for c in COLUMNS[1:-1]), "yes" if t.ok else "NO")
                        for t in tallies]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    lines += [f"{'ok ' if c.ok else 'NO '} {c.name}: {c.detail}" for c in checks]
    for t in tallies:
        lines += [f"  {t.flow}: {n}" for n in t.notes]
    return "\n".join(lines)


def passed(tallies: list[Tally], checks: list[Check]) -> bool:
    return all(t.ok for t in tallies) and all(c.ok for c in checks)


def say(line: str) -> None:
    import sys

    print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)
