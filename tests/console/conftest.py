"""The console's browser: Debian's headless Chromium driven by Selenium, and the screenshots it saves.

Tests skip, saying why (or fail, under ``TASKMESH_TEST_REQUIRE_TOOLS``), where no browser can be
had (``make deploy-tools`` installs ``chromium`` and ``chromium-driver``). Screenshots go to
``test-artefacts/console/`` (or ``$TASKMESH_TEST_ARTEFACTS/console``), one per page a test visits,
for a person to look at.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest

from tests.proc import ROOT
from tests.tools import require_tool, tool_missing

ARTEFACTS = Path(os.environ.get("TASKMESH_TEST_ARTEFACTS", ROOT / "test-artefacts")) / "console"
T = TypeVar("T")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium (one per module; each test starts with its cookies cleared)."""
    unchecked = "the console's pages were not opened in a browser"
    binary = require_tool("chromium", "Debian package chromium", unchecked)
    driver_path = require_tool("chromedriver", "Debian package chromium-driver", unchecked)
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1360,900"):
        options.add_argument(arg)
    try:
        driver = webdriver.Chrome(service=Service(driver_path), options=options)
    except Exception as exc:  # a browser that cannot start here (no display libraries, ...)
        tool_missing("a chromium that starts", f"Debian package chromium; it failed: {exc}", unchecked)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """The browser with no cookie of an earlier test (cookies ignore ports: every instance is 127.0.0.1)."""
    browser.get("about:blank")
    browser.delete_all_cookies()
    yield browser


def screenshot(driver: Any, name: str) -> Path:
    """Save the whole page as ``<name>.png`` under :data:`ARTEFACTS`."""
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    height = driver.execute_script("return Math.max(document.body.scrollHeight, 600)")
    driver.set_window_size(1360, min(int(height) + 120, 4000))
    path = ARTEFACTS / f"{name}.png"
    driver.save_screenshot(str(path))
    driver.set_window_size(1360, 900)
    return path


def go(driver: Any, element: Any) -> None:
    """Click ``element`` (a link or a form's button) and wait until the next page has replaced this one:
    a click returns before the browser has loaded what it leads to."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    old = driver.find_element(By.TAG_NAME, "html")
    element.click()
    WebDriverWait(driver, 15).until(lambda _: _is_stale(old))
    WebDriverWait(driver, 15).until(lambda d: d.execute_script("return document.readyState") == "complete")


def _is_stale(element: Any) -> bool:
    """Whether ``element`` left the document: Chromium sometimes says so with an inspector error
    ("Node with given id does not belong to the document") instead of a stale element reference."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException

    try:
        element.is_enabled()
    except StaleElementReferenceException:
        return True
    except WebDriverException as exc:
        if "does not belong to the document" in str(exc):
            return True
        raise
    return False


async def in_browser(steps: Callable[[], T]) -> T:
    """Run blocking browser ``steps`` in a thread, so the instance in this event loop keeps answering."""
    return await anyio.to_thread.run_sync(steps)
