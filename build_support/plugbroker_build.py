"""The build backend: setuptools', plus mypy (for mypyc) among the build requirements when the
compiled build is asked for (``PLUGBROKER_COMPILE=1``, see setup.py). Without it the build is
setuptools' own, pure Python."""

from __future__ import annotations

import os
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403 (the hooks not redefined here)

#: the mypy (mypyc) the compiled build is made and tested with; the test extra pins the same
MYPYC = "mypy==2.4.1"


def _compile() -> bool:
    return os.environ.get("PLUGBROKER_COMPILE", "") in ("1", "yes", "true")


# setuptools' own hooks run setup.py to find its setup_requires (it has none), which would import
# mypyc before it is installed: with the compiled build asked for, mypy is all that is added to
# pyproject's [build-system] requires.


def get_requires_for_build_wheel(config_settings: dict[str, Any] | None = None) -> list[str]:
    if _compile():
        return [MYPYC]
    return list(_setuptools.get_requires_for_build_wheel(config_settings))


def get_requires_for_build_editable(config_settings: dict[str, Any] | None = None) -> list[str]:
    if _compile():
        return [MYPYC]
    return list(_setuptools.get_requires_for_build_editable(config_settings))
