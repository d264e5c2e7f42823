"""Headless Chromium for the chat page's tests: Debian's /usr/bin/chromium driven by Playwright
(the python package, which downloads no browser of its own here). Missing: skipped, or failed in CI
(tests/required_tools.py).
"""

from collections.abc import Iterator
from contextlib import contextmanager

from tests.required_tools import missing, require_tool

CHROMIUM = "/usr/bin/chromium"
# No GPU, no QUIC, and no background connections: this machine reaches no network but the registries.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@contextmanager
def chromium() -> Iterator[object]:
    """A fresh headless Chromium (Playwright gives each launch a new, empty profile): a
    playwright.sync_api.Browser."""
    require_tool(CHROMIUM, "chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("the playwright package is not installed (pip install -e '.[test]')")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


def new_page(browser: object) -> object:
    page = browser.new_page(viewport={"width": 1100, "height": 700})  # type: ignore[attr-defined]
    page.set_default_timeout(20_000)
    return page
