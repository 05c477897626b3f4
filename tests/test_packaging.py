"""The configuration schema and the default configuration are found wherever the code runs: in
a checkout, in a zip of a checkout (``spark-submit --py-files``) and installed as package data
(pyproject.toml maps ``config/`` onto the package ``plugbroker.config_data``)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from setuptools import find_packages

from plugbroker.config.schema import DATA_PACKAGE, config_file

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

PROBE = """
import sys
from plugbroker.config import parse_config
from plugbroker.config.schema import config_file
parse_config("<broker><virtualhost name='/'><queue name='q'/></virtualhost></broker>", "x")
print(config_file("plugbroker.xsd"))
print(config_file("default.xml").read_text()[:8])
"""


def test_the_package_list_is_every_package_and_the_config_data():
    """One import namespace: broker/ is ``plugbroker``, plugins/ is ``plugbroker.plugins`` and
    config/ is the data package ``plugbroker.config_data`` (SPEC section 2 keeps the folders)."""
    listed = PYPROJECT["tool"]["setuptools"]["packages"]
    found = ["plugbroker", *(f"plugbroker.{p}" for p in find_packages(str(ROOT / "broker")))]
    assert sorted(listed) == sorted([*found, "plugbroker.plugins", DATA_PACKAGE])
    assert PYPROJECT["tool"]["setuptools"]["package-dir"] == {
        "plugbroker": "broker",
        "plugbroker.plugins": "plugins",
        DATA_PACKAGE: "config",
    }
    data = PYPROJECT["tool"]["setuptools"]["package-data"][DATA_PACKAGE]
    assert {"*.xsd", "*.xml"} <= set(data)


def test_a_checkout_reads_config_beside_the_broker_package():
    assert Path(str(config_file("plugbroker.xsd"))) == ROOT / "config" / "plugbroker.xsd"


def _probe(pythonpath: str, cwd: Path) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = pythonpath
    proc = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """``python3 -m pip wheel --no-deps -w DIR .``: the wheel CI builds (offline, local index)."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(ROOT)],
        check=True,
        timeout=240,
        capture_output=True,
    )
    (whl,) = out.glob("plugbroker-*.whl")
    return whl


@pytest.mark.slow
def test_the_wheel_holds_one_namespace_and_its_data(wheel):
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.startswith("plugbroker-")}
    assert tops == {"plugbroker"}
    assert "plugbroker/plugins/journal.py" in names
    assert "plugbroker/config_data/plugbroker.xsd" in names
    assert "plugbroker/config_data/default.xml" in names


@pytest.mark.slow
def test_the_wheel_as_a_zip_on_the_path_reads_its_package_data(wheel, tmp_path):
    """Spark's ``--py-files plugbroker-*.whl`` (docs/analyze.md): imported from the zip alone."""
    where, head = _probe(str(wheel), tmp_path)
    assert where == f"{wheel}/plugbroker/config_data/plugbroker.xsd"
    assert head == "<?xml ve"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_the_wheel_in_a_fresh_venv_runs_the_broker_from_elsewhere(wheel, tmp_path):
    """The CI step: install the wheel into a fresh venv, ``cd`` elsewhere, ``plugbroker run``
    on free ports, a kombu round trip, stop it by pid."""
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120
    )
    py = venv / "bin" / "python"
    subprocess.run(
        [str(py), "-m", "pip", "install", "--quiet", "--no-deps", str(wheel)],
        check=True,
        timeout=240,
        capture_output=True,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = subprocess.run(
        [
            str(py),
            "-c",
            PROBE.replace("import sys", "import plugbroker; print(plugbroker.__file__)"),
        ],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.splitlines()
    assert probe[0].startswith(str(venv)), probe  # the wheel, not a checkout
    assert probe[1].startswith(str(venv)) and probe[1].endswith("config_data/plugbroker.xsd")
    port, admin = _free_port(), _free_port()
    default = Path(probe[1]).with_name("default.xml").read_text()
    config = elsewhere / "broker.xml"
    config.write_text(default.replace('port="15672"', f'port="{admin}"'))
    proc = subprocess.Popen(
        [str(venv / "bin" / "plugbroker"), "run", "--config", str(config), "--port", str(port)],
        cwd=elsewhere,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        import kombu

        url = f"amqp://guest:guest@127.0.0.1:{port}//"
        deadline = time.monotonic() + 30
        while True:  # bounded: until the port answers or 30 s
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
                assert time.monotonic() < deadline, "the broker did not listen"
                time.sleep(0.1)
        with kombu.Connection(url, connect_timeout=5) as conn:
            q = kombu.Queue("wheel-check", exchange=kombu.Exchange("", type="direct"))
            with conn.Producer() as producer:
                producer.publish({"n": 1}, routing_key="wheel-check", declare=[q])
            with conn.SimpleQueue(q) as sq:
                msg = sq.get(timeout=5)
                assert msg.payload == {"n": 1}
                msg.ack()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
