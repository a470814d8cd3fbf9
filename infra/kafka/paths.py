"""Where things live on disk, and which Kafka version we run.

Environment overrides exist so CI can cache the jars and point the state at a
scratch disk without code changes.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_KAFKA_VERSION = "4.4.0"

PACKAGE_DIR = Path(__file__).resolve().parent
POM_FILE = PACKAGE_DIR / "pom.xml"
LOG4J2_CONFIG = PACKAGE_DIR / "log4j2.xml"


def kafka_version() -> str:
    return os.environ.get("SPECSTREAM_KAFKA_VERSION") or DEFAULT_KAFKA_VERSION


def cache_root() -> Path:
    override = os.environ.get("SPECSTREAM_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    return Path.home() / ".cache" / "specstream"


def kafka_cache_dir(version: str) -> Path:
    return cache_root() / "kafka" / version


def state_root() -> Path:
    override = os.environ.get("SPECSTREAM_STATE_DIR")
    if override:
        return Path(override).expanduser()
    return Path.home() / ".local" / "state" / "specstream"


def env_port(variable: str, default: int) -> int:
    """A port from the environment (e.g. SPECSTREAM_KAFKA_PORT), else ``default``."""
    raw = os.environ.get(variable)
    if not raw:
        return default
    if not raw.isdigit():
        raise ValueError(f"{variable}={raw!r} is not a port number")
    return int(raw)
