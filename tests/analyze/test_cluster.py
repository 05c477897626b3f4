"""The pipeline off the test's own SparkSession: on a standalone Spark cluster started locally
from the pyspark package (a master and a worker, bound to 127.0.0.1), and through spark-submit
with the code shipped as the zip docs/analyze.md builds. Slow (each starts its own JVMs); every
process is started and stopped here by its PID, every wait is bounded."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugbroker.analyze.preflight import java_problem
from plugbroker.analyze.synth import generate

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(java_problem() is not None, reason=f"Spark cannot start: {java_problem()}"),
]

ROOT = Path(__file__).resolve().parents[2]
CANDIDATE = """<broker><housekeeping><period>5s</period></housekeeping><virtualhost name="/">
  <queue name="work-0"><isolation><ackTimeout>30s</ackTimeout><checkPeriod>10s</checkPeriod>
  </isolation></queue>
  <topic key="stocks.us.*"><consumer><messageCount>50</messageCount><policy name="Delete"/>
  </consumer></topic>
</virtualhost></broker>"""
EXPECTED = {
    ("work-0", "IsolateConsumer", "ctag-stalled"),
    ("amq.gen-slowsubscriber", "CloseConsumerChannels", None),
    ("amq.gen-slowsubscriber", "DeleteQueue", None),
}


def spark_bin(name: str) -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / name


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MASTER")}
    env.update(SPARK_LOCAL_IP="127.0.0.1", SPARK_LOCAL_HOSTNAME="localhost", **extra)
    return env


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cluster") / "journal"
    generate(out, events=30_000, queues=6, rate=500.0, quiet=True)
    return out


@pytest.fixture
def candidate(tmp_path: Path) -> Path:
    path = tmp_path / "candidate.xml"
    path.write_text(CANDIDATE)
    return path


def wait_for_line(log: Path, text: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace"):
            return
        assert proc.poll() is None, f"exited {proc.returncode}:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)
    raise AssertionError(f"no {text!r} within {timeout} s:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``spark://127.0.0.1:PORT``: a master and one worker (2 cores, 1 GiB) from the pyspark
    package. The worker's executors import ``broker`` from this checkout (PYTHONPATH)."""
    work = tmp_path_factory.mktemp("spark-cluster")
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    klass = str(spark_bin("spark-class"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        master_log = work / "master.log"
        with master_log.open("wb") as out:
            master = subprocess.Popen(
                [klass, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1"]
                + ["--port", str(port), "--webui-port", str(free_port())],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=base_env(),
                cwd=work,
            )
        procs.append(master)
        wait_for_line(master_log, "I have been elected leader", master, 120)
        worker_log = work / "worker.log"
        with worker_log.open("wb") as out:
            worker = subprocess.Popen(
                [klass, "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1"]
                + ["--webui-port", str(free_port()), "--cores", "2", "--memory", "1g"]
                + ["--work-dir", str(work / "work")],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=base_env(PYTHONPATH=str(ROOT)),
                cwd=work,
            )
        procs.append(worker)
        wait_for_line(worker_log, "Successfully registered with master", worker, 120)
        yield url
    finally:
        for proc in reversed(procs):
            stop(proc)


def run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 400) -> str:
    proc = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, f"{argv}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


SPARK_CONF = [
    "--conf",
    "spark.driver.host=127.0.0.1",
    "--conf",
    "spark.ui.enabled=false",
    "--conf",
    "spark.executor.memory=512m",
]


def actions(out_dir: Path) -> set[tuple[str, str, str | None]]:
    data = json.loads((out_dir / "backtest.json").read_text())
    return {(a["queue"], a["action"], a["consumer_tag"]) for a in data["actions"]}


def test_backtest_and_report_on_a_standalone_cluster(cluster, journal, candidate, tmp_path):
    env = base_env(PYTHONPATH=str(ROOT))
    cli = [sys.executable, "-m", "plugbroker", "analyze"]
    out = tmp_path / "bt"
    stdout = run(
        [*cli, "backtest", "--journal", str(journal), "--config", str(candidate)]
        + ["--master", cluster, "--out", str(out), "--quiet", *SPARK_CONF],
        tmp_path,
        env,
    )
    assert "IsolateConsumer" in stdout
    assert actions(out) == EXPECTED
    report = tmp_path / "report"
    run(
        [*cli, "report", "--journal", str(journal), "--out", str(report)]
        + ["--master", cluster, "--scratch", str(tmp_path / "scratch"), "--quiet", *SPARK_CONF],
        tmp_path,
        env,
    )
    overview = json.loads((report / "overview.json").read_text())
    assert overview["events"] > 29_000
    assert (report / "report.html").stat().st_size > 10_000


def test_the_spark_submit_recipe_from_the_docs(journal, candidate, tmp_path):
    """``python3 -m pip wheel --no-deps -w dist .`` and ``spark-submit --py-files
    dist/plugbroker-*.whl cli.py analyze backtest ...``: the code, the schema and the defaults
    come from the wheel, read as a zip (the script is a copy of broker/cli.py on its own)."""
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dist), str(ROOT)],
        check=True,
        timeout=240,
        capture_output=True,
    )
    (archive,) = dist.glob("plugbroker-*.whl")
    (tmp_path / "broker").mkdir()
    shutil.copy(ROOT / "broker" / "cli.py", tmp_path / "broker" / "cli.py")
    out = tmp_path / "bt"
    run(
        [str(spark_bin("spark-submit")), "--master", "local[2]", *SPARK_CONF]
        + ["--py-files", str(archive), "broker/cli.py", "analyze", "backtest"]
        + ["--journal", str(journal), "--config", str(candidate), "--out", str(out), "--quiet"],
        tmp_path,
        base_env(PYSPARK_PYTHON=sys.executable),
    )
    assert actions(out) == EXPECTED
