"""Locate a Java runtime that can run a Kafka 4.x broker (Java 17+)."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from infra.kafka.errors import JavaError

MIN_JAVA_MAJOR = 17

# Matches both `openjdk version "17.0.15"` and legacy `java version "1.8.0_402"`.
_VERSION_RE = re.compile(r'version "(?P<version>[^"]+)"')


@dataclass(frozen=True)
class JavaRuntime:
    executable: Path
    major: int


def _candidate() -> Path:
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        executable = Path(java_home) / "bin" / "java"
        if executable.is_file():
            return executable
        raise JavaError(f"JAVA_HOME={java_home} has no bin/java; fix JAVA_HOME or unset it")
    found = shutil.which("java")
    if found is None:
        raise JavaError(
            f"Java not found: install a JDK {MIN_JAVA_MAJOR}+ (e.g. apt install openjdk-17-jre-headless) "
            "or set JAVA_HOME"
        )
    return Path(found)


def parse_major(version_output: str) -> int:
    match = _VERSION_RE.search(version_output)
    if match is None:
        raise JavaError(f"cannot read the Java version from: {version_output.strip()[:200]!r}")
    parts = match.group("version").split(".")
    # Java 8 and older report "1.<major>.…".
    major_text = parts[1] if parts[0] == "1" and len(parts) > 1 else parts[0]
    digits = re.match(r"\d+", major_text)
    if digits is None:
        raise JavaError(f"cannot read the Java version from: {match.group('version')!r}")
    return int(digits.group())


@functools.cache
def find_java() -> JavaRuntime:
    """Return the Java runtime to use, or raise JavaError with a one-line reason."""
    executable = _candidate()
    try:
        completed = subprocess.run(
            [str(executable), "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise JavaError(f"cannot run {executable} -version: {error}") from error
    major = parse_major(completed.stderr + completed.stdout)
    if major < MIN_JAVA_MAJOR:
        raise JavaError(
            f"Kafka 4.x needs Java {MIN_JAVA_MAJOR}+, but {executable} is Java {major}; set JAVA_HOME to a newer JDK"
        )
    return JavaRuntime(executable=executable, major=major)
