"""``plugbroker hash-password``: prints a passwordHash the configuration accepts and that checks
the password, from the argument or standard input."""

from __future__ import annotations

import base64
import hashlib
import io
import subprocess
import sys

import pytest

from plugbroker.cli import main
from plugbroker.config import parse_config


def _hash_of(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 0
    out = capsys.readouterr().out.strip()
    assert "\n" not in out
    return out


@pytest.mark.parametrize(
    ("algorithm", "fn"), [("sha256", hashlib.sha256), ("sha512", hashlib.sha512)]
)
def test_prints_rabbitmqs_format(capsys: pytest.CaptureFixture[str], algorithm: str, fn) -> None:
    value = _hash_of(capsys, ["hash-password", "s3cret", "--algorithm", algorithm])
    raw = base64.b64decode(value)
    salt, digest = raw[:4], raw[4:]
    assert digest == fn(salt + b"s3cret").digest()
    cfg = parse_config(
        f'<broker><users><user name="u" passwordHash="{value}" hashingAlgorithm="{algorithm}"/>'
        "</users></broker>"
    )
    assert cfg.users["u"].check_password("s3cret") and not cfg.users["u"].check_password("s3cre")


def test_reads_one_line_of_stdin(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("from stdin\nignored\n"))
    value = _hash_of(capsys, ["hash-password"])
    raw = base64.b64decode(value)
    assert raw[4:] == hashlib.sha256(raw[:4] + b"from stdin").digest()


def test_empty_password_is_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n"))
    assert main(["hash-password"]) == 2
    assert "empty" in capsys.readouterr().err


def test_the_installed_command_runs() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "plugbroker", "hash-password", "--algorithm", "sha512"],
        input="pw\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    raw = base64.b64decode(proc.stdout.strip())
    assert len(raw) == 4 + 64 and raw[4:] == hashlib.sha512(raw[:4] + b"pw").digest()
