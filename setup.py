"""The optional compiled build: ``PLUGBROKER_COMPILE=1 pip install .`` compiles the hot path
(the codec, the session, the domain, routing) with mypyc; without it (the default) nothing is
compiled and the package is pure Python. Everything else about the package is in pyproject.toml.

The compiled modules are the same source files: the pure-Python ones stay in the package beside
them, and ``plugbroker run`` logs which are in use (docs/operations.md, "The compiled build").
"""

from __future__ import annotations

import os
import runpy
from pathlib import Path
from typing import Any

from setuptools import setup

#: the modules compiled (plugbroker.X.Y is broker/X/Y.py): broker/compiled.py's list, which
#: ``plugbroker run`` also reads to log what is in use
COMPILED = [
    name.removeprefix("plugbroker.").replace(".", "/") + ".py"
    for name in runpy.run_path(str(Path(__file__).resolve().parent / "broker" / "compiled.py"))[
        "HOT_PATH"
    ]
]


def compiled_extensions() -> list[Any]:
    if os.environ.get("PLUGBROKER_COMPILE", "") not in ("1", "yes", "true"):
        return []
    from mypyc.build import mypycify

    root = Path(__file__).resolve().parent
    # mypyc names a module after its path: broker/ is seen as plugbroker/ through a link
    stage = root / "build" / "mypyc"
    stage.mkdir(parents=True, exist_ok=True)
    link = stage / "plugbroker"
    if not link.is_symlink():
        link.symlink_to(root / "broker", target_is_directory=True)
    config = stage / "mypy.ini"
    config.write_text("[mypy]\nignore_missing_imports = True\n")
    return mypycify(
        [
            f"--config-file={config}",
            f"--cache-dir={stage / 'cache'}",
            *(f"{link.relative_to(root)}/{m}" for m in COMPILED),
        ],
        opt_level="3",
        target_dir=str((stage / "c").relative_to(root)),
        group_name="plugbroker",
    )


if __name__ == "__main__":  # setuptools runs it so; tests/test_compiled.py reads the lists
    setup(ext_modules=compiled_extensions())
