"""What ``plugbroker analyze`` checks before it starts Spark, so that a missing journal, a missing
Java or a bad candidate configuration is one line on stderr and an exit code within a second,
not a traceback after Spark's start-up.

Exit codes: :data:`EXIT_INPUT` for the user's input (the journal, the candidate configuration),
:data:`EXIT_ENVIRONMENT` for the machine (no Java, or one older than :data:`MIN_JAVA`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

#: Spark 4 runs on Java 17 or later
MIN_JAVA = 17
EXIT_INPUT = 2
EXIT_ENVIRONMENT = 4


class EnvironmentProblem(Exception):
    """The machine cannot run the pipeline (no Java, too old a Java)."""


def java_executable() -> str | None:
    """The ``java`` Spark's launcher would start: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        return str(candidate) if candidate.is_file() else None
    return shutil.which("java")


def java_version(java: str) -> int | None:
    """The major version ``java -version`` reports (``17`` for 17.0.15, ``8`` for 1.8.0), or
    ``None`` if it cannot be run or read."""
    try:
        proc = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r'version "(\d+)(?:\.(\d+))?', proc.stderr + proc.stdout)
    if m is None:
        return None
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major


def java_problem() -> str | None:
    """Why Spark cannot start here, as one sentence, or ``None`` when Java is fit."""
    java = java_executable()
    if java is None:
        home = os.environ.get("JAVA_HOME")
        where = (
            f"no {home}/bin/java (JAVA_HOME)" if home else "no java on the PATH and no JAVA_HOME"
        )
        return f"the Spark pipeline needs Java {MIN_JAVA} or later: {where}"
    version = java_version(java)
    if version is None:
        return f"the Spark pipeline needs Java {MIN_JAVA} or later: cannot run {java} -version"
    if version < MIN_JAVA:
        return f"the Spark pipeline needs Java {MIN_JAVA} or later: {java} is Java {version}"
    return None


def check_java() -> None:
    """Raise :class:`EnvironmentProblem` unless a Java fit for Spark is there."""
    problem = java_problem()
    if problem is not None:
        raise EnvironmentProblem(problem)
