"""The memory accounting's pieces: whom the alarm blocks, when freed heap is handed back."""

from __future__ import annotations

import subprocess
import sys

from plugbroker import memory

MB = 1024 * 1024


def test_the_heaviest_vhosts_are_chosen_until_the_rest_hold_less_than_the_spare() -> None:
    held = {"flood": 250 * MB, "busy": 40 * MB, "quiet": 2 * MB, "": 0}
    assert memory.heaviest(held, 30 * MB) == {"flood", "busy"}
    assert memory.heaviest(held, 50 * MB) == {"flood"}
    # nobody holds enough to be chosen: nothing (the alarm then blocks everyone)
    assert memory.heaviest({"a": MB, "b": MB}, 30 * MB) == frozenset()


def test_the_trimmer_trims_once_the_account_falls_by_its_step() -> None:
    calls: list[int] = []
    t = memory.Trimmer(step=100)
    t.trim = lambda: calls.append(1)
    assert not t.update(500)  # rising: the mark follows
    assert not t.update(450)  # fell by 50 of 100
    assert t.update(399) and calls == [1]
    assert not t.update(350)  # the mark is 399 now
    assert not t.update(1000)
    assert t.update(10) and calls == [1, 1] and t.calls == 2


SCRIPT = """
import os
from plugbroker import memory
from plugbroker.alarms import RssReader
trimmer = memory.Trimmer()
read = RssReader()
start = read()
large, small = [], []
for i in range(400):  # 40 MB in 100 KB objects, each followed by a small one that stays
    large.append(os.urandom(8) * (100 * 1024 // 8))
    small.append(os.urandom(8) * 250)
grown = read() - start
del large
print(trimmer.large_blocks_mapped, grown, read() - start)
"""


def test_large_blocks_go_back_to_the_system_when_freed() -> None:
    """With glibc mapping blocks of 64 KiB or more on their own, large objects freed amid
    small ones that stay give their memory back at once, without a trim (in a fresh process:
    pytest's heap has a history)."""
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=True
    ).stdout.split()
    mapped, grown, left = out[0] == "True", int(out[1]), int(out[2])
    assert mapped and grown > 30 * MB
    assert left < grown - 30 * MB, (grown, left)
