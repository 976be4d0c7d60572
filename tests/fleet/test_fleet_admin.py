"""The fleet app's admin pages through Django's test client: jobs with progress and cancel,
cartridges with the loss curve and download, a build started from an uploaded corpus, fleets
with their documents and the "try a query" page."""

from __future__ import annotations

import threading
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from fleet.models import BuildJob, Cartridge, Document, Fleet
from fleet.services import jobs
from tests.fixtures.synthetic_gguf import synthetic_path

pytestmark = pytest.mark.django_db

CORPUS = "The Zorblax 3000 is a made-up kettle. It boils water in 42 seconds and sings when done. " * 4


@pytest.fixture
def cartridge(tmp_path) -> Cartridge:
    path = tmp_path / "kettle.safetensors"
    path.write_bytes(b"\x00" * 4096)  # the admin serves bytes; it does not parse them
    history = [[1, 2.5], [2, 2.0], [3, 1.6], [4, 1.2]]
    return Cartridge.objects.create(
        path=str(path),
        rows=16,
        steps=4,
        status="ready",
        loss_history=history,
        held_out_history=[[0, 2.75], [4, 1.5]],
        model_fingerprint="ab" * 16,
    )


def test_the_fleet_pages_need_a_staff_login(client, cartridge):
    for url in ("/admin/fleet/cartridge/", "/admin/fleet/cartridge/build/", "/admin/fleet/buildjob/"):
        response = client.get(url)
        assert response.status_code == 302 and "/admin/login/" in response["Location"]
    assert client.get(f"/admin/fleet/cartridge/{cartridge.pk}/download/").status_code == 302


def test_jobs_are_listed_with_state_and_progress(admin_client):
    job = jobs.create_job("cartridge", {"out": "/tmp/x.safetensors"})
    BuildJob.objects.filter(pk=job.pk).update(
        state="running",
        step=3,
        total=12,
        progress=0.25,
        loss=1.5,
        conversations=96,
        coverage=7.25,
        held_out_loss=2.125,
    )
    page = admin_client.get("/admin/fleet/buildjob/").content.decode()
    assert '<progress value="0.250" max="1"></progress> 25%' in page and "3/12" in page and "running" in page
    assert "2.125" in page and "96" in page
    detail = admin_client.get(f"/admin/fleet/buildjob/{job.pk}/change/").content.decode()
    assert 'http-equiv="refresh"' in detail and "Cancel this job" in detail
    assert "7.25" in detail and "2.125" in detail and "96" in detail


def test_cancel_from_the_job_page_and_as_a_list_action(admin_client):
    queued = jobs.create_job("cartridge", {})
    response = admin_client.post(f"/admin/fleet/buildjob/{queued.pk}/cancel/", follow=True)
    assert f"Job #{queued.pk} cancelled" in response.content.decode()  # message_user capitalises
    queued.refresh_from_db()
    assert queued.state == "cancelled" and queued.error == "cancelled before it started"
    detail = admin_client.get(f"/admin/fleet/buildjob/{queued.pk}/change/").content.decode()
    assert 'http-equiv="refresh"' not in detail and "Cancel this job" not in detail
    running = jobs.create_job("cartridge", {})
    jobs.claim(running.pk)
    data = {"action": "cancel_jobs", "_selected_action": [running.pk, queued.pk]}
    page = admin_client.post("/admin/fleet/buildjob/", data, follow=True).content.decode()
    assert "asked to stop" in page and "has already finished (cancelled)" in page
    assert BuildJob.objects.get(pk=running.pk).cancel_requested
    assert admin_client.get(f"/admin/fleet/buildjob/{running.pk}/cancel/").status_code == 405


def test_a_cartridge_page_draws_its_loss_curve_and_offers_the_file(admin_client, cartridge):
    listing = admin_client.get("/admin/fleet/cartridge/").content.decode()
    assert "kettle.safetensors" in listing and "Start a build" in listing and "abababababab" in listing
    page = admin_client.get(f"/admin/fleet/cartridge/{cartridge.pk}/change/").content.decode()
    start = page.index('<svg xmlns="http://www.w3.org/2000/svg" class="loss-curve"')
    svg = page[start : page.index("</svg>", start) + 6]
    train, held = ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}polyline")
    assert len(train.get("points").split()) == 4 and len(held.get("points").split()) == 2
    assert f"/admin/fleet/cartridge/{cartridge.pk}/download/" in page
    response = admin_client.get(f"/admin/fleet/cartridge/{cartridge.pk}/download/")
    assert response.status_code == 200 and b"".join(response.streaming_content) == b"\x00" * 4096
    assert 'filename="kettle.safetensors"' in response["Content-Disposition"]
    Path(cartridge.path).unlink()
    assert admin_client.get(f"/admin/fleet/cartridge/{cartridge.pk}/download/").status_code == 404
    assert (
        "the file is missing"
        in admin_client.get(f"/admin/fleet/cartridge/{cartridge.pk}/change/").content.decode()
    )


def _upload(name: str = "manual.txt", data: bytes = CORPUS.encode()) -> SimpleUploadedFile:
    return SimpleUploadedFile(name, data, content_type="text/plain")


@pytest.mark.django_db(transaction=True)  # the build runs in a thread with its own connection
def test_a_build_started_from_an_uploaded_corpus_runs_and_leaves_a_cartridge(
    admin_client, settings, tmp_path, synthetic_dir
):
    settings.LMSERVE_BUILD_DIR = tmp_path / "builds"
    settings.CELERY_BROKER_URL = ""
    model = synthetic_path("llama", synthetic_dir)
    form = {
        "name": "kettle",
        "model": str(model),
        "prefix_tokens": 16,
        "steps": 0,
        "minutes": 0,
        "lr": 0.002,
        "seed": 0,
    }
    response = admin_client.post("/admin/fleet/cartridge/build/", {**form, "corpus": _upload()})
    assert response.status_code == 302
    # The job's id from the redirect, and no read of the job table until the build's thread has
    # ended: the test database is SQLite's shared in-memory cache, where a read that meets the
    # thread's write fails the write at once ("table is locked"), as a file database would not.
    job_id = int(response["Location"].removeprefix("/admin/fleet/buildjob/").split("/")[0])
    for thread in threading.enumerate():
        if thread.name == f"build-job-{job_id}":
            thread.join(600)  # a cold numba cache compiles first
    job = BuildJob.objects.get()
    assert response["Location"] == f"/admin/fleet/buildjob/{job.pk}/change/" and job.pk == job_id
    assert job.runner == "thread" and job.parameters["prefix_tokens"] == 16
    assert job.state == "succeeded", (job.state, job.error, job.log)
    cartridge = Cartridge.objects.get()
    assert Path(cartridge.path) == (tmp_path / "builds" / "cartridges" / "kettle.safetensors").resolve()
    assert cartridge.rows == 16 and cartridge.corpus_name == "manual.txt"
    (kept,) = (tmp_path / "builds" / "corpora").glob("*/*")
    assert kept.read_text() == CORPUS
    again = admin_client.post("/admin/fleet/cartridge/build/", {**form, "corpus": _upload()})
    assert "a cartridge named kettle exists already" in again.content.decode()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"corpus": _upload(data=b"\xff\xfe not utf-8")}, "not UTF-8 text"),
        ({"corpus": _upload(data=b"   \n")}, "the corpus is empty"),
        ({"name": "../escape"}, "letters, digits"),
        ({"model": "no-such-model"}, "no-such-model"),
        ({"prefix_tokens": 0}, "greater than or equal to 1"),
        ({"minutes": -1}, "greater than or equal to 0"),
    ],
)
def test_a_bad_build_request_is_refused_on_the_form(admin_client, settings, tmp_path, change, message):
    settings.LMSERVE_BUILD_DIR = tmp_path / "builds"
    form = {
        "name": "kettle",
        "model": "",
        "prefix_tokens": 16,
        "steps": 0,
        "minutes": 0,
        "lr": 0.002,
        "seed": 0,
    }
    form["corpus"] = _upload()
    page = admin_client.post("/admin/fleet/cartridge/build/", {**form, **change}).content.decode()
    assert message in page and not BuildJob.objects.exists()
    assert not (tmp_path / "builds" / "cartridges").exists()


def test_fleets_list_their_documents_and_chunks(admin_client, tmp_path):
    fleet = Fleet.objects.create(
        directory=str(tmp_path / "manuals"), prefix_tokens=64, documents_count=2, chunks=5
    )
    kettle = {
        "tokens": 900,
        "cartridge_file": "doc-000.safetensors",
        "cartridge_bytes": 3 * 2**20,
        "chunks": 4,
    }
    Document.objects.create(fleet=fleet, name="kettle", **kettle)
    Document.objects.create(
        fleet=fleet, name="toaster", tokens=200, cartridge_file="doc-001.safetensors", chunks=1
    )
    page = admin_client.get(f"/admin/fleet/fleet/{fleet.pk}/change/").content.decode()
    assert "kettle" in page and "toaster" in page and "3.00 MiB" in page and "Try a query" in page
    assert "900" in page and f"/admin/fleet/fleet/{fleet.pk}/query/" in page
    listing = admin_client.get("/admin/fleet/document/").content.decode()
    assert "kettle" in listing and "toaster" in listing
    query = admin_client.get(f"/admin/fleet/fleet/{fleet.pk}/query/").content.decode()
    assert 'id="query-form"' in query and "--rag-chunks" in query
    empty = admin_client.post(
        f"/admin/fleet/fleet/{fleet.pk}/query/", {"text": "", "rag_chunks": 8, "rag_docs": 2}
    )
    assert "This field is required" in empty.content.decode()
