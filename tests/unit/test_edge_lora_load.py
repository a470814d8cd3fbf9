"""POST /v1/load_lora_adapter answers 200 once every live worker of the base model serves the adapter, not the first:
the requests topic does not route by adapter, so a chat sent right after the 200 may land on any of them (found by
the chaos soak: a chat right after a load got 404 model_not_found from the second worker)."""
from __future__ import annotations

import time
from types import SimpleNamespace

from schemas.adapters import AdapterCommand
from schemas.events import ServiceAnnouncement
from streams.edge.lora_api import _served_everywhere

BASE = "smollm2-135m-instruct"


def _worker(name: str, adapters: dict[str, str], *, model: str = BASE, at: float | None = None) -> ServiceAnnouncement:
    now = time.time()
    return ServiceAnnouncement(kind="engine-worker", service_id=name, state="ready", started_at=now - 60,
                               models=[model, *adapters], adapters=adapters, at=now if at is None else at)


def _edge(*workers: ServiceAnnouncement) -> SimpleNamespace:
    return SimpleNamespace(readiness=SimpleNamespace(live_workers=lambda: list(workers)))


def _load(at: float | None = None) -> AdapterCommand:
    return AdapterCommand(command_id="c1", action="load", lora_name="sql", lora_path="/a", base_model=BASE,
                          at=time.time() - 1 if at is None else at)


def test_a_load_is_done_only_when_every_worker_of_the_base_model_serves_the_adapter() -> None:
    one = _worker("w1", {"sql": BASE})
    assert not _served_everywhere(_edge(one, _worker("w2", {})), _load(), fresh=False)
    assert _served_everywhere(_edge(one, _worker("w2", {"sql": BASE})), _load(), fresh=False)


def test_workers_of_another_model_do_not_hold_a_load_up_and_no_worker_is_not_done() -> None:
    other = _worker("gemma", {}, model="gemma-3-270m")
    assert _served_everywhere(_edge(_worker("w1", {"sql": BASE}), other), _load(), fresh=False)
    assert not _served_everywhere(_edge(other), _load(), fresh=False)


def test_a_reload_in_place_waits_for_every_worker_to_announce_after_the_command() -> None:
    command = _load(at=time.time())
    stale = _worker("w2", {"sql": BASE}, at=command.at - 5)
    fresh = _worker("w1", {"sql": BASE}, at=command.at + 1)
    assert not _served_everywhere(_edge(fresh, stale), command, fresh=True)
    assert _served_everywhere(_edge(fresh, _worker("w2", {"sql": BASE}, at=command.at + 2)), command, fresh=True)
