"""A broker in a subprocess (``python3 -m plugbroker run``) on a store directory: what the kill -9
tests, the soak script and the store benchmark start, kill and restart."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

CONFIG = """<?xml version="1.0"?>
<broker>
  <listen host="127.0.0.1" port="0"/>
  <store path="{store}"/>
  <users><user name="guest" password="guest" vhosts="/"/></users>
  <housekeeping><threads>1</threads><period>60000</period></housekeeping>
  <virtualhost name="/">{vhost}</virtualhost>
</broker>
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(directory: Path, store: Path, vhost: str = "", name: str = "broker.xml") -> Path:
    path = directory / name
    path.write_text(CONFIG.format(store=store, vhost=vhost))
    return path


class BrokerProcess:
    """``python3 -m plugbroker run --config <cfg> --port <port>``; :meth:`start` waits until it
    listens (or raises with its output if it exits first)."""

    def __init__(
        self,
        config: Path,
        *,
        port: int | None = None,
        log: Path | None = None,
        env: dict[str, str] | None = None,
        log_level: str = "WARNING",
        python: str = sys.executable,
    ) -> None:
        #: the interpreter that runs the broker (another one may import another tree)
        self.python = python
        self.config = config
        self.port = port or free_port()
        self.log = log
        self.env = dict(os.environ, **(env or {}))
        self.env["PYTHONPATH"] = str(ROOT) + os.pathsep + self.env.get("PYTHONPATH", "")
        self.log_level = log_level
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_in = 0.0

    def start(self, timeout: float = 60.0) -> BrokerProcess:
        t0 = time.monotonic()
        out = open(self.log, "ab") if self.log is not None else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            [
                self.python,
                "-m",
                "plugbroker",
                "--log-level",
                self.log_level,
                "run",
                "--config",
                str(self.config),
                "--port",
                str(self.port),
            ],
            stdout=subprocess.PIPE,
            stderr=out,
            env=self.env,
            cwd=str(ROOT),
        )
        assert self.proc.stdout is not None
        line = b""
        while time.monotonic() - t0 < timeout:
            line = self.proc.stdout.readline()
            if not line:
                break
            if b"listening" in line:
                self.started_in = time.monotonic() - t0
                return self
        code = self.proc.wait(10)
        err = self.log.read_text(errors="replace")[-4000:] if self.log is not None else ""
        raise RuntimeError(f"broker did not start (exit {code}): {line!r}\n{err}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 30.0) -> int:
        """Graceful stop (SIGTERM); returns the exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill9()
                return -9
        return self.proc.returncode

    def status(self) -> dict[str, int]:
        """VmRSS / VmHWM (peak) in KiB, from /proc."""
        out: dict[str, int] = {}
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "VmHWM"):
                    out[k] = int(v.split()[0])
        return out

    def __enter__(self) -> BrokerProcess:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kill9()


@contextmanager
def tmpfs(path: Path, size: int) -> Iterator[str | None]:
    """``path`` (created if need be) on a tmpfs of ``size`` bytes until the block ends, then
    unmounted; yields None, or why it cannot be mounted here (``mount`` needs root)."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        yield f"cannot mount a small filesystem here: {done.stderr.strip()}"
        return
    try:
        yield None
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
