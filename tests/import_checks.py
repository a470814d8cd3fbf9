"""What a fresh interpreter has imported after running some code: for the tests that keep heavy imports out of our
processes' starts (torch's compiler stack: torch._dynamo drags inductor and triton in, 5-8 s on 2 cores)."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

COMPILER_MODULES = ("torch._dynamo", "torch._inductor", "triton")
REPO = Path(__file__).resolve().parents[1]


def loaded_after(code: str, modules: tuple[str, ...] = COMPILER_MODULES) -> list[str]:
    """Which of ``modules`` are loaded once ``code`` ran in a new interpreter (in the checkout's root)."""
    probe = f"{code}\nimport sys\nprint(sorted(m for m in {modules!r} if m in sys.modules))\n"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return ast.literal_eval(done.stdout.strip().splitlines()[-1])
