"""What a user reads about a configuration: every schema error at once, a warning for a bare
number (how it was read), a did-you-mean for a misspelled policy."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from plugbroker.cli import main
from plugbroker.config import load_config

HEAD = '<broker>\n  <users><user name="guest" password="guest" vhosts="/"/></users>\n'


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "broker.xml"
    path.write_text(HEAD + body + "</broker>\n")
    return path


def test_check_config_lists_every_schema_error_with_file_and_line(tmp_path, capsys) -> None:
    path = write(
        tmp_path,
        "  <housekeeping><period>soon</period><threads>x</threads></housekeeping>\n"
        '  <virtualhost name="/">\n'
        '    <topic key="a.*"><consumer><messageCount>many</messageCount>'
        '<policy name="Log"/></consumer></topic>\n'
        "  </virtualhost>\n",
    )
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"plugbroker: {path}:3: <period>: 'soon' is not a duration "
        "(use ms or a number with ms|s|m|h|d)",
        f"plugbroker: {path}:3: <threads>: 'x' is not a whole number of 1 or more",
        f"plugbroker: {path}:5: <messageCount>: 'many' is not a whole number of 0 or more",
        f"plugbroker: 3 errors in {path}",
    ]


def test_a_bare_number_warns_with_element_place_and_unit(tmp_path, caplog) -> None:
    path = write(
        tmp_path,
        "  <housekeeping><period>30</period></housekeeping>\n"
        "  <limits><frameMax>8192</frameMax><heartbeat>0</heartbeat></limits>\n"
        '  <virtualhost name="/"/>\n',
    )
    with caplog.at_level(logging.WARNING, logger="plugbroker.config"):
        cfg = load_config(path)
    assert cfg.housekeeping_period == pytest.approx(0.03)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        f"{path}:3: <period>: bare number 30 read as milliseconds (30ms); write the unit to "
        "say so, e.g. <period>30ms</period>",
        f"{path}:4: <frameMax>: bare number 8192 read as bytes (8KB); write the unit to say "
        "so, e.g. <frameMax>8KB</frameMax>",
    ]  # a zero is the same in every unit: no warning


def test_a_value_with_its_unit_does_not_warn(tmp_path, caplog) -> None:
    path = write(
        tmp_path, '  <housekeeping><period>30s</period></housekeeping>\n  <virtualhost name="/"/>\n'
    )
    with caplog.at_level(logging.WARNING, logger="plugbroker.config"):
        assert load_config(path).housekeeping_period == 30.0
    assert caplog.records == []


def test_a_misspelled_policy_gets_a_did_you_mean(tmp_path, capsys) -> None:
    path = write(
        tmp_path,
        '  <virtualhost name="/">\n'
        '    <topic key="a.*"><consumer><messageCount>5</messageCount>'
        '<policy name="Delte"/></consumer></topic>\n'
        "  </virtualhost>\n",
    )
    assert main(["--log-level", "WARNING", "check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:4: <policy>: attribute name: policy 'Delte' is not built in" in err
    assert err.rstrip().endswith("did you mean 'Delete'?")
