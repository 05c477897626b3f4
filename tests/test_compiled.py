"""The optional compiled build (broker/compiled.py, setup.py): what ``plugbroker run`` reports.

In CI's compiled step (.ci/compiled) ``PLUGBROKER_EXPECT_COMPILED=1`` is set, and every
hot-path module must then be a compiled extension; otherwise whatever is reported must be so.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import runpy
from pathlib import Path

from plugbroker import compiled

ROOT = Path(__file__).resolve().parents[1]
SUFFIXES = tuple(importlib.machinery.EXTENSION_SUFFIXES)


def test_each_module_reported_compiled_imports_from_an_extension() -> None:
    for name in compiled.in_use():
        origin = importlib.import_module(name).__file__ or ""
        assert origin.endswith(SUFFIXES), (name, origin)


def test_the_compiled_build_is_complete_when_expected() -> None:
    found = compiled.in_use()
    if os.environ.get("PLUGBROKER_EXPECT_COMPILED") == "1":
        assert found == list(compiled.HOT_PATH)
        assert compiled.describe().startswith("compiled (mypyc): all")
    elif not found:
        assert compiled.describe().startswith("pure Python")


def test_every_hot_path_module_exists_as_source() -> None:
    for name in compiled.HOT_PATH:
        path = ROOT / "broker" / (name.removeprefix("plugbroker.").replace(".", "/") + ".py")
        assert path.is_file(), path


def test_setup_py_compiles_the_listed_modules_and_nothing_unless_asked(monkeypatch) -> None:
    monkeypatch.delenv("PLUGBROKER_COMPILE", raising=False)
    ns = runpy.run_path(str(ROOT / "setup.py"), run_name="not_main")
    assert ns["COMPILED"] == [
        n.removeprefix("plugbroker.").replace(".", "/") + ".py" for n in compiled.HOT_PATH
    ]
    assert ns["compiled_extensions"]() == []
