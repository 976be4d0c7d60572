"""The cartridge admin as a person uses it, in a real headless Chromium against a live server:
start a build from an uploaded corpus, watch the job page (it refreshes itself while the job
runs) reach "succeeded", open the cartridge, see its loss-curve picture and download the file.
The screenshots are kept under ``test-artifacts/``."""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import Error as PlaywrightError

from tests.fixtures.synthetic_gguf import synthetic_path

from .test_admin_browser import artifacts_dir, chromium_page  # noqa: F401  (the browser fixture)
from .test_fresh_install import manage

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

CORPUS = "The Zorblax 3000 is a made-up kettle. It boils water in 42 seconds and sings when done. " * 4


def _wait_for_text(page, text: str, timeout: float) -> None:
    """The job page reloads itself every 2 s while the job runs; look after each reload."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if text in page.content():
                return
        except PlaywrightError:  # caught mid-reload: look again once it has loaded
            page.wait_for_load_state()
        page.wait_for_timeout(500)
    raise AssertionError(f"{text!r} never appeared:\n{page.inner_text('#content')}")


def test_a_browser_builds_a_cartridge_and_downloads_it(start_server, tmp_path, chromium_page, synthetic_dir):  # noqa: F811
    data = tmp_path / "fresh"
    server = start_server("--ctx", "256", env={"LMSERVE_DATA_DIR": str(data), "CELERY_BROKER_URL": ""})
    made = manage(data, "createsuperuser", "--noinput", "--username", "admin", "--email", "a@example.com")
    assert made.returncode == 0, made.stderr
    corpus = tmp_path / "kettle-manual.txt"
    corpus.write_text(CORPUS)
    page = chromium_page

    page.goto(server.url + "/admin/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "s3cret-pass")
    page.click("input[type=submit]")
    page.wait_for_url(server.url + "/admin/")
    page.click("text=Cartridges")
    page.wait_for_url(server.url + "/admin/fleet/cartridge/")
    page.click("#start-build")
    page.set_input_files("#id_corpus", str(corpus))
    page.fill("#id_name", "kettle")
    page.fill("#id_model", str(synthetic_path("llama", synthetic_dir)))
    page.fill("#id_prefix_tokens", "16")
    page.fill("#id_steps", "2")
    page.click("#build-form input[type=submit]")
    page.wait_for_url("**/admin/fleet/buildjob/*/change/")
    _wait_for_text(page, "succeeded", 300)
    assert "100%" in page.inner_text("#content") and "done" in page.inner_text(".build-log")
    page.screenshot(path=str(artifacts_dir() / "admin-build-job.png"), full_page=True)

    page.goto(server.url + "/admin/fleet/cartridge/")
    page.click("text=kettle.safetensors")
    curve = page.locator("svg.loss-curve")
    box = curve.bounding_box()
    assert curve.is_visible() and (box["width"], box["height"]) == (480, 200)
    assert curve.locator("polyline.loss").count() == 1 and curve.locator("polyline.held-out").count() == 1
    page.screenshot(path=str(artifacts_dir() / "admin-cartridge.png"), full_page=True)
    with page.expect_download() as download:
        page.click("a.download")
    saved = download.value.path()
    written = data / "builds" / "cartridges" / "kettle.safetensors"
    assert download.value.suggested_filename == "kettle.safetensors"
    assert open(saved, "rb").read() == written.read_bytes() and written.stat().st_size > 0
