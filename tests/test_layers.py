"""The layers of docs/architecture.md hold: imports point down only.

The contracts are import-linter's, in pyproject.toml (``[tool.importlinter]``); this test runs
them, so the README's test command fails on an import that points up (a plugin reaching into
the domain, the codec importing the session, the store importing the core ...).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_layer_contract_is_kept() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from importlinter.cli import lint_imports;"
            " sys.exit(lint_imports(no_cache=True, no_logo=True))",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout
