"""What every configuration section shares: the error type, byte sizes, and the frozen, strict base model."""
from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict

ENV_PREFIX = "SPECSTREAM_"
ENV_NESTED_DELIMITER = "__"
DEFAULT_CONFIG_FILE = Path("specstream.yaml")
CONFIG_FILE_ENV = "SPECSTREAM_CONFIG"
DEFAULT_MODEL = "smollm2-135m-instruct"
MIB = 1024 * 1024

_TOPIC_SAFE = r"^[a-zA-Z0-9._-]+$"
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
          "g": 1000**3, "gb": 1000**3, "gib": 1024**3}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


class ConfigError(Exception):
    """A configuration problem, described in one line that names the offending key."""


def parse_byte_size(value: Any) -> Any:
    """Accept byte sizes as numbers or as strings like ``512MiB`` / ``2GB`` (binary and decimal units)."""
    if isinstance(value, str):
        match = _SIZE_RE.match(value)
        if match is None or match.group(2).lower() not in _UNITS:
            raise ValueError(f"expected a byte size such as 1048576, 512KiB or 2GB, got {value!r}")
        return int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    return value


ByteSize = Annotated[int, BeforeValidator(parse_byte_size)]


class Section(BaseModel):
    # Frozen: settings are read by several threads (engine driver, event loop).
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


def host_pid_id(fallback: str) -> str:
    """``<hostname>-<pid>``, usable in a topic name: the default id of a service instance."""
    host = re.sub(r"[^a-zA-Z0-9._-]+", "-", socket.gethostname()).strip("-.") or fallback
    return f"{host}-{os.getpid()}"
