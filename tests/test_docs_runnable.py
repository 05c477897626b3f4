"""The docs' runnable blocks do what they say.

A fenced block in ``docs/*.md`` (or the README) is *runnable* when the line before its fence is
an HTML comment ``<!-- runnable ... -->`` (invisible on the rendered page):

* ``<!-- runnable -->`` before an ``xml`` block: a complete configuration; ``plugbroker
  check-config`` must accept it.
* ``<!-- runnable: broker -->`` before an ``xml`` block: the children of ``<broker>`` (or a
  ``<virtualhost>``), checked inside a minimal ``<broker>`` with user guest.
* ``file="NAME"`` in either: the block is also written to ``NAME`` in the page's scratch
  directory, for the console blocks after it; ``invalid`` instead: check-config must refuse it.
* ``<!-- runnable -->`` before a ``console`` block: each ``$ command`` runs with bash in the
  page's scratch directory (one per page, blocks in page order), ``plugbroker`` being this tree's
  ``python3 -m plugbroker`` and ``docs/examples`` on ``PYTHONPATH``, bounded by a timeout. The lines
  after a command are its expected output (stdout and stderr): they must match, except that a
  line ``...`` matches any lines and log lines lose their timestamp. A command whose exit status
  is not 0 must show it as a last line ``[exit N]``.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
MARKED = re.compile(
    r"^<!-- runnable(?P<opts>[^>]*)-->\n```(?P<lang>\w+)\n(?P<body>.*?)^```$",
    re.MULTILINE | re.DOTALL,
)
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")
TIMEOUT = 60
WRAP = """<broker>
  <users><user name="guest" password="guest" vhosts="/"/></users>
{body}</broker>
"""


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    opts: str
    body: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    def opt(self, name: str) -> str | None:
        m = re.search(rf'\b{name}="([^"]*)"', self.opts)
        return m[1] if m else None


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    return [
        Block(page, text.count("\n", 0, m.start()) + 2, m["lang"], m["opts"], m["body"])
        for m in MARKED.finditer(text)
    ]


def _env(shims: Path) -> dict[str, str]:
    path = os.pathsep.join([str(ROOT), str(ROOT / "docs" / "examples")])
    return {
        **os.environ,
        "PYTHONPATH": path,
        "PATH": f"{shims}{os.pathsep}{os.environ.get('PATH', '')}",
        "COLUMNS": "100",
    }


def _shims(tmp: Path) -> Path:
    shims = tmp / ".bin"
    shims.mkdir(exist_ok=True)
    shim = shims / "plugbroker"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m broker "$@"\n')
    shim.chmod(0o755)
    return shims


def _run(cmd: str, cwd: Path, env: dict[str, str]) -> tuple[int, list[str]]:
    proc = subprocess.run(
        ["bash", "-c", cmd],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=TIMEOUT,
    )
    lines = [TIMESTAMP.sub("", ln).rstrip() for ln in proc.stdout.splitlines()]
    return proc.returncode, lines


def _matches(expected: list[str], actual: list[str]) -> bool:
    if not expected:
        return not actual
    head, rest = expected[0], expected[1:]
    if head == "...":
        return any(_matches(rest, actual[i:]) for i in range(len(actual) + 1))
    return bool(actual) and actual[0] == head and _matches(rest, actual[1:])


def _check_xml(block: Block, scratch: Path, env: dict[str, str]) -> None:
    body = block.body
    if ": broker" in block.opts:
        body = WRAP.format(body=body)
    name = block.opt("file") or f"block-{block.line}.xml"
    path = scratch / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body)
    status, out = _run(
        f"plugbroker --log-level WARNING check-config {shlex.quote(name)}", scratch, env
    )
    if "invalid" in block.opts:
        assert status == 2, f"{block.where}: check-config accepted a block marked invalid"
    else:
        assert status == 0, f"{block.where}: check-config refused it:\n" + "\n".join(out)


def _check_console(block: Block, scratch: Path, env: dict[str, str]) -> None:
    steps: list[tuple[str, list[str]]] = []
    for line in block.body.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line.rstrip())
        elif line.strip():
            raise AssertionError(f"{block.where}: output before the first '$ ' command")
    assert steps, f"{block.where}: a runnable console block without a '$ ' command"
    for cmd, expected in steps:
        status, out = _run(cmd, scratch, env)
        if status:
            out.append(f"[exit {status}]")
        assert _matches(expected, out), (
            f"{block.where}: `{cmd}` printed\n"
            + "\n".join(out)
            + "\nexpected\n"
            + "\n".join(expected)
        )


PAGES_WITH_BLOCKS = [p for p in PAGES if blocks(p)]


def test_some_blocks_are_marked_runnable() -> None:
    assert sum(len(blocks(p)) for p in PAGES) >= 4


@pytest.mark.parametrize("page", PAGES_WITH_BLOCKS, ids=lambda p: p.name)
def test_runnable_blocks_do_what_the_page_says(page: Path, tmp_path: Path) -> None:
    env = _env(_shims(tmp_path))
    for block in blocks(page):
        if block.lang == "xml":
            _check_xml(block, tmp_path, env)
        elif block.lang == "console":
            _check_console(block, tmp_path, env)
        else:
            raise AssertionError(
                f"{block.where}: runnable blocks are xml or console, not {block.lang}"
            )


def test_the_matcher() -> None:
    assert _matches(["a", "...", "d"], ["a", "b", "c", "d"])
    assert _matches(["..."], [])
    assert not _matches(["a", "d"], ["a", "b", "d"])
    assert not _matches(["a"], ["a", "b"])
