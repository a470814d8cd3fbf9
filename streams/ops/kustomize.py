"""Render a kustomization with the real kustomize: ``kustomize build``, else ``kubectl kustomize`` (the same
renderer, embedded in kubectl), so ``specstream k8s build`` prints what ``kubectl apply -k`` applies.

kustomize is not packaged for Debian; ``./dev setup test`` installs the pinned version with ``go install`` into
``$SPECSTREAM_CACHE_DIR/go/bin`` (default ``~/.cache/specstream/go/bin``), where this looks first. What only we know,
the KafkaTopics and the ScaledObject derived from the catalog and the policy, is :mod:`streams.ops.manifests`.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

# The version ./dev installs (keep the two equal).
KUSTOMIZE_VERSION = "v5.8.0"
INSTALL_HINT = (f"install it: go install sigs.k8s.io/kustomize/kustomize/v5@{KUSTOMIZE_VERSION} "
                "(./dev setup test does), or install kubectl")
Resource = dict[str, Any]


class KustomizeError(ValueError):
    """No renderer found, or kustomize refused the kustomization (its own message, which names the file)."""


def cached_kustomize() -> Path:
    base = os.environ.get("SPECSTREAM_CACHE_DIR") or str(Path.home() / ".cache" / "specstream")
    return Path(base) / "go" / "bin" / "kustomize"


def renderer() -> list[str]:
    """The command that renders a folder given as its last argument: ours, kustomize on PATH, then kubectl's."""
    if os.access(cached_kustomize(), os.X_OK):
        return [str(cached_kustomize()), "build"]
    if found := shutil.which("kustomize"):
        return [found, "build"]
    if found := shutil.which("kubectl"):
        return [found, "kustomize"]
    raise KustomizeError(f"kustomize not found (looked in {cached_kustomize().parent}, PATH, kubectl); "
                         + INSTALL_HINT)


def build(folder: Path) -> list[Resource]:
    """Every resource the kustomization in ``folder`` renders to, in kustomize's order."""
    command = [*renderer(), str(folder)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise KustomizeError(f"{' '.join(command)}: {error}") from None
    if done.returncode != 0:
        raise KustomizeError(f"{Path(command[0]).name} {command[1]} {folder}: {done.stderr.strip() or 'failed'}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]
