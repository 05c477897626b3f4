"""``plugbroker analyze`` checks its inputs and Java before Spark starts: one line on stderr and
an exit code, within a second, and no traceback. None of these needs Java: the checks stop the
command before Spark would start (the Java check is made to fail with a JAVA_HOME without one)."""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path

import pytest

from plugbroker.analyze.preflight import (
    EXIT_ENVIRONMENT,
    EXIT_INPUT,
    MIN_JAVA,
    java_problem,
    java_version,
)
from plugbroker.analyze.spark import python_for_workers
from plugbroker.analyze.synth import generate
from plugbroker.cli import main


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("j") / "events"
    generate(path, events=3000)
    return path


def fake_java(directory: Path, version_line: str) -> Path:
    """A JAVA_HOME whose bin/java prints ``version_line`` as ``java -version`` does."""
    java = directory / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text(f"#!/bin/sh\necho '{version_line}' >&2\n")
    java.chmod(java.stat().st_mode | stat.S_IXUSR)
    return directory


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, float]:
    t = time.monotonic()
    code = main(["analyze", *argv, "--quiet"])
    return code, capsys.readouterr().err, time.monotonic() - t


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_a_missing_journal_is_refused_before_spark_starts(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-java"))  # would fail later: not reached
    code, err, _ = run(
        capsys, "report", "--journal", str(tmp_path / "missing"), "--out", str(tmp_path)
    )
    assert code == EXIT_INPUT
    assert "no such journal directory" in one_line(err) and "missing" in err


def test_a_bad_candidate_is_refused_with_its_file_and_line(journal, tmp_path, capsys):
    cand = tmp_path / "candidate.xml"
    cand.write_text("<broker>\n  <virtualhost name='/'>\n    <queue nam='x'/>\n")
    code, err, _ = run(capsys, "backtest", "--journal", str(journal), "--config", str(cand))
    assert code == EXIT_INPUT
    assert str(cand) in one_line(err)
    code, err, _ = run(
        capsys, "backtest", "--journal", str(journal), "--config", str(tmp_path / "nope.xml")
    )
    assert code == EXIT_INPUT and "nope.xml" in one_line(err)


def test_no_java_is_one_line_and_its_own_exit_code(journal, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-java"))
    code, err, seconds = run(capsys, "recommend", "--journal", str(journal))
    assert code == EXIT_ENVIRONMENT
    line = one_line(err)
    assert f"Java {MIN_JAVA}" in line and "no-java" in line
    assert seconds < 10  # refused before Spark would start, not after its start-up


def test_too_old_a_java_is_refused(journal, tmp_path, capsys, monkeypatch):
    home = fake_java(tmp_path / "jdk8", 'openjdk version "1.8.0_392"')
    monkeypatch.setenv("JAVA_HOME", str(home))
    assert java_version(str(home / "bin" / "java")) == 8
    code, err, _ = run(capsys, "report", "--journal", str(journal), "--out", str(tmp_path / "o"))
    assert code == EXIT_ENVIRONMENT and "is Java 8" in one_line(err)


def test_java_versions_are_read_as_their_major_number(tmp_path, monkeypatch):
    home = fake_java(tmp_path / "jdk21", 'openjdk version "21.0.2" 2024-01-16')
    monkeypatch.setenv("JAVA_HOME", str(home))
    assert java_version(str(home / "bin" / "java")) == 21
    assert java_problem() is None


def test_spark_workers_run_the_drivers_interpreter_unless_told(monkeypatch):
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    assert python_for_workers() == sys.executable
    assert os.environ["PYSPARK_PYTHON"] == sys.executable
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/other/python3")
    assert python_for_workers() == "/opt/other/python3"
    monkeypatch.delenv("PYSPARK_PYTHON")
    assert python_for_workers({"spark.pyspark.python": "/opt/py"}) == "/opt/py"
    assert "PYSPARK_PYTHON" not in os.environ
