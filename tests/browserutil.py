"""Headless Chromium for the web UI's tests and screenshots: Debian's ``chromium`` and
``chromium-driver`` driven by selenium, with no network but the broker's loopback port.

``.ci/run`` installs them when missing and sets ``PLUGBROKER_REQUIRE_BROWSER=1``, so there a
missing browser fails the test instead of skipping it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: the flags every run uses: headless, sandbox off (root in CI containers), nothing phoning home
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--window-size=1400,900",
)


def find() -> tuple[str, str] | None:
    """``(chromium, chromedriver)`` paths, or None when either is missing."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if browser is None or driver is None:
        return None
    return browser, driver


def missing_reason() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    if find() is None:
        return "chromium and chromium-driver are not installed (apt-get install them)"
    return None


@contextmanager
def chromium(width: int = 1400, height: int = 900) -> Iterator[Any]:
    """A headless Chromium under selenium with a temporary profile, quit at the end."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    paths = find()
    assert paths is not None, missing_reason()
    browser, driver_path = paths
    profile = tempfile.mkdtemp(prefix="plugbroker-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--window-size={width},{height}")
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def require_or_skip() -> None:
    """Skip the calling test when the browser is missing, unless CI requires it."""
    import pytest

    why = missing_reason()
    if why is None:
        return
    if os.environ.get("PLUGBROKER_REQUIRE_BROWSER") == "1":
        pytest.fail(why)
    pytest.skip(why)
