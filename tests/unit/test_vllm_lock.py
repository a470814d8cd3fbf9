"""infra/vllm/uv.lock stays in step with the project: it records specstream's own metadata (dependencies, extras,
groups), so a pyproject.toml change that only the main lock follows makes `./dev setup vllm` (uv sync --locked) fail."""
from __future__ import annotations

import tomllib
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]


def _specstream_metadata(lock: Path) -> dict:
    packages = tomllib.loads(lock.read_text())["package"]
    return next(p for p in packages if p["name"] == "specstream")["metadata"]


def test_the_vllm_lock_records_the_same_specstream_as_the_main_lock() -> None:
    main = _specstream_metadata(_ROOT / "uv.lock")
    vllm = _specstream_metadata(_ROOT / "infra" / "vllm" / "uv.lock")
    assert vllm == main, "infra/vllm/uv.lock is stale: run ./dev lock (it relocks both) and commit both locks"
