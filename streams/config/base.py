"""What every configuration section shares: the error type, byte sizes, and the frozen, strict base model.

Byte sizes, the base model and the default model are the engine's (engine.config): its settings are the `engine`
section, and engine/ cannot import streams/.
"""
from __future__ import annotations

import os
import re
import socket
from pathlib import Path

from engine.config import DEFAULT_MODEL, ByteSize, Section, parse_byte_size

__all__ = [
    "CONFIG_FILE_ENV",
    "DEFAULT_CONFIG_FILE",
    "DEFAULT_MODEL",
    "ENV_NESTED_DELIMITER",
    "ENV_PREFIX",
    "MIB",
    "ByteSize",
    "ConfigError",
    "Section",
    "host_pid_id",
    "parse_byte_size",
]

ENV_PREFIX = "SPECSTREAM_"
ENV_NESTED_DELIMITER = "__"
DEFAULT_CONFIG_FILE = Path("specstream.yaml")
CONFIG_FILE_ENV = "SPECSTREAM_CONFIG"
MIB = 1024 * 1024

_TOPIC_SAFE = r"^[a-zA-Z0-9._-]+$"


class ConfigError(Exception):
    """A configuration problem, described in one line that names the offending key."""


def host_pid_id(fallback: str) -> str:
    """``<hostname>-<pid>``, usable in a topic name: the default id of a service instance."""
    host = re.sub(r"[^a-zA-Z0-9._-]+", "-", socket.gethostname()).strip("-.") or fallback
    return f"{host}-{os.getpid()}"
