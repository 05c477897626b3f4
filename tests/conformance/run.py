"""Conformance step: the clients' own integration suites against plugbroker.

Downloads the sdists of py-amqp and kombu (versions pinned below) with pip, unpacks them into a
temporary directory, starts a plugbroker on a free loopback port (its own event loop thread, the
configuration of ``tests/brokerutil.py``: user guest/guest on vhost ``/``), and runs

* py-amqp's ``t/integration/test_rmq.py``, the tests without TLS (``-k "not tls"``);
* kombu's ``t/integration/test_py_amqp.py``;

with ``RABBITMQ_HOST`` / ``RABBITMQ_5672_TCP`` pointing at it, as their CI points them at a
RabbitMQ. Each suite must pass in full with the expected number of tests (so a suite that
collects nothing is a failure too). The suites' ``flaky`` marks are pytest-rerunfailures'; it is
not installed on purpose (``-p no:rerunfailures`` if it is): a conformance failure is not retried
into a pass.

Run: ``python3 tests/conformance/run.py [--sdists DIR] [--keep]`` (``--sdists``: a directory
that already holds the two ``.tar.gz``; nothing is downloaded). Exit status 0 when both suites
pass in full. See docs/conformance.md.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from brokerutil import BrokerThread, write_config  # noqa: E402

AMQP_VERSION = "5.4.2"
KOMBU_VERSION = "5.7.0"
#: seconds each suite may take before it counts as failed
SUITE_TIMEOUT = 150


@dataclass(frozen=True)
class Suite:
    name: str
    sdist: str
    args: tuple[str, ...]
    expected: int


SUITES = (
    Suite(
        "py-amqp",
        f"amqp-{AMQP_VERSION}",
        ("t/integration/test_rmq.py", "-k", "not tls"),
        12,
    ),
    Suite("kombu", f"kombu-{KOMBU_VERSION}", ("t/integration/test_py_amqp.py",), 51),
)

_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)")


def download(dest: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--no-binary",
            ":all:",
            f"amqp=={AMQP_VERSION}",
            f"kombu=={KOMBU_VERSION}",
            "-d",
            str(dest),
        ],
        check=True,
        timeout=300,
    )


def unpack(sdists: Path, work: Path) -> None:
    for suite in SUITES:
        archive = sdists / f"{suite.sdist}.tar.gz"
        if not archive.exists():
            raise SystemExit(f"{archive}: no such sdist (run without --sdists to download it)")
        with tarfile.open(archive) as tar:
            tar.extractall(work, filter="data")


def run_suite(suite: Suite, work: Path, port: int) -> tuple[bool, str]:
    env = {
        **os.environ,
        "RABBITMQ_HOST": "127.0.0.1",
        "RABBITMQ_5672_TCP": str(port),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:rerunfailures",
        "-W",
        "ignore::pytest.PytestUnknownMarkWarning",
        "-o",
        "addopts=",
        *suite.args,
    ]
    started = time.monotonic()
    try:
        proc = subprocess.run(
            cmd,
            cwd=work / suite.sdist,
            env=env,
            capture_output=True,
            text=True,
            timeout=SUITE_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        return False, f"{suite.name}: did not finish within {SUITE_TIMEOUT} s"
    took = time.monotonic() - started
    tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    counts = {kind: int(n) for n, kind in _COUNT.findall(tail)}
    passed = counts.get("passed", 0)
    ok = proc.returncode == 0 and passed == suite.expected and len(counts) == 1
    line = f"{suite.name}: {passed}/{suite.expected} passed in {took:.0f} s ({tail})"
    if not ok:
        line += "\n" + proc.stdout[-6000:] + proc.stderr[-2000:]
    return ok, line


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sdists", type=Path, help="directory with the two sdists (no download)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    a = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="plugbroker-conformance-"))
    try:
        sdists = a.sdists
        if sdists is None:
            sdists = tmp / "sdists"
            download(sdists)
        work = tmp / "src"
        unpack(sdists, work)
        broker = BrokerThread(write_config(tmp)).start()
        try:
            results = [run_suite(s, work, broker.port) for s in SUITES]
        finally:
            broker.stop()
    finally:
        if a.keep:
            print(f"kept {tmp}")
        else:
            subprocess.run(["rm", "-rf", str(tmp)], check=False)
    for _, line in results:
        print(line)
    return 0 if all(ok for ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
