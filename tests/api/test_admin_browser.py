"""The admin as a person sees it: a real headless Chromium logs in on a fresh install, follows
the index's link to the KV page and finds the admin's stylesheet applied. A screenshot of the
page is kept under ``test-artifacts/`` (or ``$LMSERVE_TEST_ARTIFACTS``).

The browser is Debian's ``chromium`` (``scripts/test.py`` installs it), driven by Playwright
over its own protocol; Playwright's browser download is not used.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from .conftest import ROOT
from .test_fresh_install import manage

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CHROMIUM = os.environ.get("LMSERVE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ADMIN_HEADER_BLUE = "rgb(65, 118, 144)"  # #417690, the header colour of Django's admin base.css


def artifacts_dir() -> Path:
    path = Path(os.environ.get("LMSERVE_TEST_ARTIFACTS") or ROOT / "test-artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def chromium_page(tmp_path):
    """A page in a fresh headless Chromium profile."""
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        pytest.fail(f"no Chromium at {CHROMIUM}: run scripts/test.py (it installs Debian's chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        # A persistent context is how Playwright takes a --user-data-dir: a fresh one per test.
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_FLAGS,
        )
        try:
            yield context.new_page()
        finally:
            context.close()


def test_a_browser_logs_in_and_sees_the_styled_kv_page(start_server, tmp_path, chromium_page):
    data = tmp_path / "fresh"
    server = start_server("--ctx", "256", env={"LMSERVE_DATA_DIR": str(data)})
    made = manage(data, "createsuperuser", "--noinput", "--username", "admin", "--email", "a@example.com")
    assert made.returncode == 0, made.stderr
    page = chromium_page

    page.goto(server.url + "/admin/")
    assert page.url.startswith(server.url + "/admin/login/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "s3cret-pass")
    page.click("input[type=submit]")
    page.wait_for_url(server.url + "/admin/")
    page.click("text=KV cache")
    page.wait_for_url(server.url + "/admin/kv/")
    page.screenshot(path=str(artifacts_dir() / "admin-kv.png"), full_page=True)

    assert page.is_visible("#kv-slots") and "Resident KV slots" in page.content()
    header = page.eval_on_selector("#header", "e => getComputedStyle(e).backgroundColor")
    assert header == ADMIN_HEADER_BLUE, f"the admin stylesheet is not applied (header {header})"
    sheets = page.evaluate("() => [...document.styleSheets].map(s => s.href).filter(Boolean)")
    assert any(href.endswith("/static/admin/css/base.css") for href in sheets)
    assert page.evaluate("() => [...document.styleSheets].every(s => s.cssRules.length > 0)")
