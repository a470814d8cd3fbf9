"""Resolve the Kafka broker's runtime classpath from Maven Central, once per version.

We use Maven instead of downloading the Kafka tarball because Maven Central is the
one artifact source reachable from every environment we run in (CI included), and
Maven already knows how to verify and cache what it fetches in ~/.m2.
"""

from __future__ import annotations

import collections
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from infra.kafka.errors import JarResolutionError
from infra.kafka.locking import exclusive
from infra.kafka.paths import POM_FILE, kafka_cache_dir, kafka_version

Progress = Callable[[str], None]

MARKER_NAME = "libs.complete"
# A Maven "Downloaded" line: "Downloaded from central: https://…/x-1.0.jar (1.2 MB at 3 MB/s)".
_DOWNLOADED_RE = re.compile(r"Downloaded from \S+: \S+/(?P<name>[^/\s]+\.jar) \((?P<size>[^,)]+?)(?: at [^)]*)?\)")
_FAILURE_TAIL_LINES = 30


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def libs_dir(version: str) -> Path:
    return kafka_cache_dir(version) / "libs"


def _marker(version: str) -> Path:
    return kafka_cache_dir(version) / MARKER_NAME


def is_resolved(version: str) -> bool:
    """True when a previous resolution finished and none of its jars went missing."""
    marker = _marker(version)
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    jars = recorded.get("jars") if isinstance(recorded, dict) else None
    if not isinstance(jars, list) or not jars:
        return False
    libs = libs_dir(version)
    return all((libs / str(name)).is_file() for name in jars)


def _maven_executable() -> str:
    found = shutil.which("mvn")
    if found is None:
        raise JarResolutionError(
            "Maven (mvn) not found: install Maven 3.8+ (e.g. apt install maven); "
            "it fetches the Kafka jars from Maven Central on first use"
        )
    return found


def _report_line(line: str, progress: Progress) -> None:
    downloaded = _DOWNLOADED_RE.search(line)
    if downloaded is not None:
        progress(f"  downloaded {downloaded.group('name')} ({downloaded.group('size')})")
    elif line.startswith(("[ERROR]", "[WARNING]")):
        progress(f"  {line}")


def _run_maven(maven: str, version: str, work_dir: Path, output_dir: Path, progress: Progress) -> None:
    pom = work_dir / "pom.xml"
    # Run from a private copy so the source tree (maybe read-only site-packages)
    # never gets a target/ folder.
    shutil.copyfile(POM_FILE, pom)
    command = [
        maven,
        "-B",
        "-Dstyle.color=never",
        "-f",
        str(pom),
        "dependency:copy-dependencies",
        f"-Dkafka.version={version}",
        f"-DoutputDirectory={output_dir}",
    ]
    tail: collections.deque[str] = collections.deque(maxlen=_FAILURE_TAIL_LINES)
    with subprocess.Popen(
        command,
        cwd=work_dir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        bufsize=1,
    ) as child:
        if child.stdout is None:
            raise JarResolutionError("internal error: Maven output pipe missing")
        for raw in child.stdout:
            line = raw.rstrip()
            tail.append(line)
            _report_line(line, progress)
        returncode = child.wait()
    if returncode != 0:
        details = "\n".join(tail)
        raise JarResolutionError(f"Maven failed (exit {returncode}) resolving Kafka {version}; last output:\n{details}")


def _install(version: str, staging: Path) -> None:
    jars = sorted(path.name for path in staging.glob("*.jar"))
    broker_jar = f"kafka_2.13-{version}.jar"
    if broker_jar not in jars:
        raise JarResolutionError(f"Maven finished but {broker_jar} is missing from {staging}")
    target = libs_dir(version)
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)
    marker = _marker(version)
    partial_marker = marker.with_suffix(".tmp")
    partial_marker.write_text(json.dumps({"version": version, "jars": jars}, indent=1))
    partial_marker.replace(marker)


def ensure_kafka_jars(version: str | None = None, progress: Progress | None = None) -> Path:
    """Return the folder holding the broker classpath, resolving it with Maven if needed.

    The first call on a machine downloads ~45 MB of jars (plus the Maven plugin) through Maven and reports one line
    per downloaded jar to ``progress`` (stderr by default); later calls return at once.
    """
    resolved_version = version or kafka_version()
    report = progress or _stderr
    if is_resolved(resolved_version):
        return libs_dir(resolved_version)
    work_dir = kafka_cache_dir(resolved_version)
    # Two test sessions (or a test and a developer's CLI) may resolve at the same
    # time; Maven copying into the same folder twice would interleave files.
    with exclusive(work_dir / ".resolve.lock"):
        if is_resolved(resolved_version):
            return libs_dir(resolved_version)
        maven = _maven_executable()
        staging = work_dir / "libs.partial"
        if staging.exists():
            shutil.rmtree(staging)
        report(f"kafka: resolving Kafka {resolved_version} jars with Maven into {libs_dir(resolved_version)} (once)")
        _run_maven(maven, resolved_version, work_dir, staging, report)
        _install(resolved_version, staging)
        report(f"kafka: Kafka {resolved_version} jars ready")
    return libs_dir(resolved_version)
