"""The configuration schema and the default configuration are found wherever the code runs: in
a checkout, in a zip of a checkout (``spark-submit --py-files``) and installed as package data
(pyproject.toml maps ``config/`` onto the package ``plugbroker.config_data``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
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
    listed = PYPROJECT["tool"]["setuptools"]["packages"]
    found = find_packages(str(ROOT), include=["broker*", "plugins*"])
    assert sorted(listed) == sorted([*found, DATA_PACKAGE])
    assert PYPROJECT["tool"]["setuptools"]["package-dir"] == {DATA_PACKAGE: "config"}
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


@pytest.mark.skipif(shutil.which("zip") is None, reason="needs the zip command (docs/analyze.md)")
def test_a_zip_of_the_checkout_as_the_docs_build_it(tmp_path):
    """``zip -qr plugbroker.zip broker plugins config``, imported from the zip alone."""
    archive = tmp_path / "plugbroker.zip"
    subprocess.run(
        ["zip", "-qr", str(archive), "broker", "plugins", "config"],
        cwd=ROOT,
        check=True,
        timeout=60,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where, head = _probe(str(archive), elsewhere)
    assert where == f"{archive}/config/plugbroker.xsd"
    assert head == "<?xml ve"


def test_installed_package_data_is_found_when_config_is_not_beside_broker(tmp_path):
    """A wheel's layout: ``broker/`` and ``plugbroker.config_data/`` side by side, no ``config/``."""
    site = tmp_path / "site"
    shutil.copytree(ROOT / "broker", site / "broker", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(
        ROOT / "plugins", site / "plugins", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copytree(ROOT / "config", site / DATA_PACKAGE)
    where, _ = _probe(str(site), tmp_path)
    assert where == str(site / DATA_PACKAGE / "plugbroker.xsd")
