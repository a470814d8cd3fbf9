"""Where a vLLM-backed worker runs: vLLM's own environment (``.venv-vllm``, installed by ``./dev setup vllm``).

vLLM pins torch and transformers to versions the main environment has moved past, so it lives in a second virtual
environment with specstream installed editable beside it. ``specstream worker`` with ``engine.backend: vllm``
re-executes itself there, with the same arguments and environment, so ``specstream up``, the autoscaler and users
start it the same way as any worker.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

# Where ./dev puts it; SPECSTREAM_VLLM_PYTHON names another interpreter that has vLLM and specstream.
_REPO_VENV = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"


def vllm_python() -> Path:
    named = os.environ.get("SPECSTREAM_VLLM_PYTHON")
    return Path(named) if named else _REPO_VENV


def move_to_vllm_environment(say: Callable[[str], None]) -> None:
    """Return when this interpreter has vLLM; else exec the vLLM environment's (never returns) or exit 1."""
    if importlib.util.find_spec("vllm") is not None:
        return
    python = vllm_python()
    if not python.is_file():
        say(f"worker: error: engine.backend: vllm needs vLLM's environment, and {python} does not exist: "
            "run ./dev setup vllm (or set SPECSTREAM_VLLM_PYTHON)")
        raise SystemExit(1)
    say(f"worker: engine.backend is vllm: continuing in {python}")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(python, [str(python), "-m", "streams.cli", *sys.argv[1:]])


_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """SIGKILL this process when its parent dies (Linux's PR_SET_PDEATHSIG; elsewhere nothing).

    vLLM's engine core and its model worker are spawned children that outlive a parent killed with -9."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    import multiprocessing

    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:  # the parent died before the guard was set
        os._exit(1)
