"""A sandbox slot serves any number of calls: bubblewrap's leftover processes are collected by the runner, not left
as zombies counting against the slot's process limit (where PID 1 does not reap, as in this container)."""
from __future__ import annotations

import asyncio

from streams.config import Settings
from streams.config.tools import ToolSettings
from streams.tools.sandbox.runner import Sandbox


def test_one_slot_runs_more_calls_than_its_process_limit() -> None:
    # A uid of its own: other tests' runners, killed mid-call, may have left zombies PID 1 never collects on the
    # shared slots' uids, and those count against the limit too.
    settings = Settings().tools.sandbox.model_copy(update={"uid_base": Settings().tools.sandbox.uid_base + 3000})
    limits = ToolSettings(executor="python", parameters={}, timeout_s=10, max_processes=4)

    async def calls() -> list[tuple[int, str]]:
        sandbox = Sandbox(settings, slots=1)
        outcomes = [await sandbox.run([settings.python, "-I", "-S", "-c", "print(7)"], b"", limits) for _ in range(12)]
        return [(o.exit_status, o.stdout.strip() or o.stderr[-200:]) for o in outcomes]

    assert asyncio.run(calls()) == [(0, "7")] * 12
