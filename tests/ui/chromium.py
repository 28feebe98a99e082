"""Helpers of the Chromium tests: a headless page of Debian's ``/usr/bin/chromium`` driven by
Playwright (no browser download; a missing browser fails the test: .ci/run installs it). The
``ui_server`` and ``artifacts`` fixtures are in conftest.py."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.plugins.workers import wait_until

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


@contextmanager
def chromium_page() -> Iterator[tuple[Any, list[str]]]:
    """A page of Debian's headless Chromium (missing, the test fails: .ci/run installs it), and
    the page and console errors it reports (the caller asserts none); confirmations accepted."""
    if not (Path(CHROMIUM).exists() and shutil.which(CHROMIUM)):
        pytest.fail(f"no Chromium at {CHROMIUM}: apt-get install -y chromium (.ci/run does)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("console", lambda msg: errors.append(f"{msg.text} {msg.location}") if msg.type == "error" else None)
            page.on("dialog", lambda dialog: dialog.accept())
            yield page, errors
        finally:
            browser.close()


def until_shown(page: Any, url: str, check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Load ``url`` again until ``check()`` holds on it (a page that does not refresh itself)."""

    def shown() -> bool:
        page.goto(url)
        return check()

    wait_until(shown, timeout=timeout, interval=0.5, what=what)
