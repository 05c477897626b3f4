"""Which event loop ``plugbroker run`` runs on: --loop, PLUGBROKER_LOOP, uvloop when installed."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from plugbroker.cli import main as cli_main
from plugbroker.runner import LOOP_ENV, LoopError, loop_factory, uses_tls


@pytest.fixture(autouse=True)
def no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LOOP_ENV, raising=False)


@pytest.fixture
def no_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if uvloop were not installed (``import uvloop`` raises ImportError)."""
    monkeypatch.setitem(sys.modules, "uvloop", None)


def test_asyncio_is_asyncios_own_loop() -> None:
    assert loop_factory("asyncio") == (None, "asyncio")


def test_uvloop_when_asked_and_installed() -> None:
    uvloop = pytest.importorskip("uvloop")
    factory, name = loop_factory("uvloop")
    assert name == f"uvloop {uvloop.__version__}"
    assert factory is not None
    loop = factory()
    try:
        assert isinstance(loop, uvloop.Loop)
        assert loop.run_until_complete(asyncio.sleep(0, "ran")) == "ran"
    finally:
        loop.close()


def test_auto_prefers_uvloop_when_installed() -> None:
    pytest.importorskip("uvloop")
    assert loop_factory("auto")[1].startswith("uvloop ")
    assert loop_factory(None)[1].startswith("uvloop ")  # auto is the default


@pytest.mark.usefixtures("no_uvloop")
def test_auto_falls_back_to_asyncio_without_uvloop() -> None:
    assert loop_factory("auto") == (None, "asyncio")


@pytest.mark.usefixtures("no_uvloop")
def test_uvloop_asked_but_missing_is_an_error() -> None:
    with pytest.raises(LoopError, match=r"plugbroker\[uvloop\]"):
        loop_factory("uvloop")


def test_the_environment_chooses_and_the_argument_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LOOP_ENV, "asyncio")
    assert loop_factory() == (None, "asyncio")
    monkeypatch.setenv(LOOP_ENV, " AsyncIO ")
    assert loop_factory() == (None, "asyncio")
    if loop_factory("auto")[1] != "asyncio":  # uvloop installed
        assert loop_factory("uvloop")[1].startswith("uvloop ")


def test_an_unknown_loop_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(LoopError, match="unknown event loop 'trio'"):
        loop_factory("trio")
    monkeypatch.setenv(LOOP_ENV, "tokio")
    with pytest.raises(LoopError, match="tokio"):
        loop_factory()


def test_run_refuses_a_bad_loop_before_starting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(LOOP_ENV, "tokio")
    assert cli_main(["run", "--port", "1"]) == 2
    assert "unknown event loop 'tokio'" in capsys.readouterr().err


@pytest.mark.usefixtures("no_uvloop")
def test_run_refuses_uvloop_when_missing(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["run", "--loop", "uvloop", "--port", "1"]) == 2
    assert "uvloop is not installed" in capsys.readouterr().err


def test_tls_listeners_keep_auto_on_asyncio_and_refuse_uvloop() -> None:
    assert loop_factory("auto", tls=True)[0] is None
    assert loop_factory("auto", tls=True)[1].startswith("asyncio (TLS listeners configured")
    assert loop_factory("asyncio", tls=True)[0] is None
    with pytest.raises(LoopError, match="TLS"):
        loop_factory("uvloop", tls=True)


@pytest.mark.parametrize(
    ("xml", "tls"),
    [
        ("<broker/>", False),
        ('<broker><listen port="5672"/><admin port="15672"/></broker>', False),
        ('<broker><tls port="5671" cert="c" key="k"/></broker>', True),
        ('<broker><admin port="15672"><tls cert="c" key="k"/></admin></broker>', True),
        ("<broker><not closed", False),  # the full load reports it
    ],
)
def test_uses_tls_reads_the_file_before_it_is_loaded(tmp_path: Path, xml: str, tls: bool) -> None:
    path = tmp_path / "b.xml"
    path.write_text(xml)
    assert uses_tls(path) is tls
    assert uses_tls(None) is False
    assert uses_tls(tmp_path / "missing.xml") is False
