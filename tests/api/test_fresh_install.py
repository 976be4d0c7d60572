"""A fresh installation: the database is migrated by the server, the secret key is generated
once and kept, and errors inside Django's views reach the log."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
import threading

import httpx
import pytest

from lmserve_site.secret import installation_secret

from .conftest import ROOT


def test_the_secret_key_is_generated_once_and_private(tmp_path):
    path = tmp_path / "data" / ".secret_key"
    keys: list[str] = []
    threads = [threading.Thread(target=lambda: keys.append(installation_secret(path))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(keys)) == 1 and len(keys[0]) >= 50
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert installation_secret(path) == keys[0]
    assert not [p for p in path.parent.iterdir() if p.name != ".secret_key"]  # no temporary left


def manage(data_dir, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "LMSERVE_DATA_DIR": str(data_dir), "DJANGO_SUPERUSER_PASSWORD": "s3cret-pass"}
    env.pop("LMSERVE_SECRET_KEY", None)
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args], cwd=ROOT, env=env, capture_output=True, text=True
    )


@pytest.mark.slow
def test_a_fresh_install_serves_the_admin_and_keeps_its_key(start_server, tmp_path):
    data = tmp_path / "fresh"
    env = {"LMSERVE_DATA_DIR": str(data)}
    server = start_server("--ctx", "256", env=env)
    tables = sqlite3.connect(data / "db.sqlite3").execute("select name from sqlite_master").fetchall()
    assert ("auth_user",) in tables and ("django_session",) in tables
    made = manage(data, "createsuperuser", "--noinput", "--username", "admin", "--email", "a@example.com")
    assert made.returncode == 0, made.stderr
    key = (data / ".secret_key").read_text()
    assert stat.S_IMODE((data / ".secret_key").stat().st_mode) == 0o600

    with httpx.Client(base_url=server.url) as browser:
        login = browser.get("/admin/login/")
        token = browser.cookies["csrftoken"]
        r = browser.post(
            "/admin/login/?next=/admin/",
            data={"username": "admin", "password": "s3cret-pass", "csrfmiddlewaretoken": token},
            headers={"referer": server.url + "/admin/login/"},
        )
        assert login.status_code == 200 and r.status_code == 302 and r.headers["location"] == "/admin/"
        assert "KV cache" in browser.get("/admin/").text
    server.stop()
    start_server("--ctx", "256", env=env)
    assert (data / ".secret_key").read_text() == key  # kept across restarts


@pytest.mark.slow
def test_errors_inside_django_views_are_logged(start_server, tmp_path):
    data = tmp_path / "fresh"
    server = start_server("--ctx", "256", env={"LMSERVE_DATA_DIR": str(data)})
    (data / "db.sqlite3").unlink()  # the next connection opens an empty database
    r = httpx.get(server.url + "/admin/", cookies={"sessionid": "x" * 32})
    assert r.status_code == 500
    logs = server.logs()
    assert "Internal Server Error: /admin/" in logs and "no such table: django_session" in logs
