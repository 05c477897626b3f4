"""A SIGHUP in the first moments of ``plugbroker run`` (while its modules load) does not kill
the process: the note-taking handler is installed before anything slow is imported."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import amqp
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _catches_sighup(pid: int) -> bool:
    """Whether the process has a handler for SIGHUP (its SigCgt mask in /proc)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) & (1 << (signal.SIGHUP - 1)))
    except OSError:
        pass
    return False


def _loaded(pid: int, fragment: str) -> bool:
    try:
        return fragment in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def test_sighup_while_the_modules_load_does_not_kill_the_broker(tmp_path: Path) -> None:
    config = tmp_path / "broker.xml"
    config.write_text('<broker><listen host="127.0.0.1" port="0"/></broker>')
    port = _free_port()
    log = tmp_path / "broker.log"
    with open(log, "ab") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "plugbroker",
                "run",
                "--config",
                str(config),
                "--port",
                str(port),
            ],
            stdout=subprocess.PIPE,
            stderr=err,
            cwd=tmp_path,
        )
    try:
        deadline = time.monotonic() + 30
        while not _catches_sighup(proc.pid):  # the first thing main() does
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline
        # the broker's slow imports (the XML schema's lxml among them) have not run yet
        early = not _loaded(proc.pid, "lxml")
        proc.send_signal(signal.SIGHUP)
        proc.send_signal(signal.SIGHUP)
        assert early, "the SIGHUP handler came after the broker's modules were loaded"
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert b"listening" in line, (proc.poll(), log.read_text()[-3000:])
        assert "SIGHUP while starting: ignored" in log.read_text()
        conn = amqp.Connection(f"127.0.0.1:{port}", userid="guest", password="guest")
        conn.connect()
        conn.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
