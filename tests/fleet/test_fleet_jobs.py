"""Fleet build jobs around ``fleet.fleets.build.build_fleet``: the job row, the Fleet and Document rows, the
build_fleet command, the admin's "try a query" page on a real fleet, and the per-document
fan-out on a real Celery worker."""

from __future__ import annotations

import json

import numpy as np
import pytest
from django.core.management import CommandError, call_command

from fleet.cartridges.file import load_cartridge
from fleet.fleets.format import read_manifest
from fleet.models import BuildJob, Document, Fleet
from fleet.services.fleets import create_fleet_job, record_fleet, run_fleet_job
from tests.fixtures.synthetic_gguf import synthetic_path

DOCS = {
    "alpine": "Marmots whistle across alpine meadows while glaciers retreat each summer. " * 3,
    "bakery": "Sourdough rises overnight; the baker folds the dough and bakes at dawn.",
    "chess": "The knight forks king and rook; white castles short and pushes the passed pawn. " * 2,
}


@pytest.fixture
def docs_dir(tmp_path):
    directory = tmp_path / "docs"
    directory.mkdir()
    for name, text in DOCS.items():
        (directory / f"{name}.txt").write_text(text, encoding="utf-8")
    return directory


def _parameters(docs_dir, out, model) -> dict:
    return {
        "docs_dir": str(docs_dir),
        "out": str(out),
        "model": str(model),
        "prefix_tokens": 8,
        "embed_chunk": 16,
    }


@pytest.mark.django_db
def test_a_fleet_job_builds_and_records_the_fleet_and_its_documents(docs_dir, tmp_path, synthetic_dir):
    model = synthetic_path("llama", synthetic_dir)
    job = run_fleet_job(
        create_fleet_job(_parameters(docs_dir, tmp_path / "fleet", model)).pk, celery_fanout=False
    )
    assert job.state == "succeeded", job.error
    assert job.result["documents"] == 3 and job.progress == 1.0 and "in-process" in job.log
    manifest = read_manifest(tmp_path / "fleet")
    fleet = Fleet.objects.get()
    assert (fleet.documents_count, fleet.prefix_tokens, fleet.job_id) == (3, 8, job.pk)
    assert fleet.chunks == job.result["chunks"] == sum(d.chunks for d in manifest.documents)
    assert fleet.model_fingerprint == manifest.model_fingerprint
    rows = {d.name: d for d in Document.objects.filter(fleet=fleet)}
    for doc in manifest.documents:
        row = rows[doc.name]
        assert (row.tokens, row.chunks, row.cartridge_file) == (doc.tokens, doc.chunks, doc.cartridge)
        assert row.cartridge_bytes == (tmp_path / "fleet" / doc.cartridge).stat().st_size > 0


@pytest.mark.django_db(transaction=True)
def test_recording_a_fleet_changes_its_rows_all_at_once_or_not_at_all(docs_dir, tmp_path, synthetic_dir):
    model = synthetic_path("llama", synthetic_dir)
    job = run_fleet_job(
        create_fleet_job(_parameters(docs_dir, tmp_path / "fleet", model)).pk, celery_fanout=False
    )
    assert job.state == "succeeded", job.error
    before = sorted(Document.objects.values_list("name", "cartridge_bytes"))
    doc = read_manifest(tmp_path / "fleet").documents[1]
    (tmp_path / "fleet" / doc.cartridge).unlink()
    with pytest.raises(FileNotFoundError):
        record_fleet(tmp_path / "fleet", model)
    assert sorted(Document.objects.values_list("name", "cartridge_bytes")) == before


@pytest.mark.django_db
def test_a_failed_fleet_job_says_why(docs_dir, tmp_path, synthetic_dir):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "something").write_text("x")
    model = synthetic_path("llama", synthetic_dir)
    job = run_fleet_job(create_fleet_job(_parameters(docs_dir, out, model)).pk, celery_fanout=False)
    assert job.state == "failed" and "not an empty directory" in job.error and not Fleet.objects.exists()
    with pytest.raises(ValueError, match="unknown fleet build parameters: bogus"):
        create_fleet_job({**_parameters(docs_dir, out, model), "bogus": 1})


@pytest.mark.django_db
def test_build_fleet_command_prints_the_summary(docs_dir, tmp_path, synthetic_dir, capsys, settings):
    settings.CELERY_BROKER_URL = ""
    model = synthetic_path("llama", synthetic_dir)
    out = tmp_path / "fleet"
    call_command(
        "build_fleet", str(docs_dir), "--out", str(out), "--model", str(model), "--prefix-tokens", "8"
    )
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"documents", "chunks", "steps", "seconds"} <= set(summary) and summary["documents"] == 3
    assert BuildJob.objects.get().state == "succeeded" and Fleet.objects.get().documents_count == 3
    with pytest.raises(CommandError, match="no such directory"):
        call_command("build_fleet", str(tmp_path / "nowhere"), "--out", str(tmp_path / "f2"))
    with pytest.raises(CommandError, match="CELERY_BROKER_URL"):
        call_command("build_fleet", str(docs_dir), "--out", str(tmp_path / "f3"), "--celery")


@pytest.mark.django_db
def test_the_admin_tries_a_query_on_a_real_fleet(admin_client, docs_dir, tmp_path, synthetic_dir):
    model = synthetic_path("llama", synthetic_dir)
    run_fleet_job(create_fleet_job(_parameters(docs_dir, tmp_path / "fleet", model)).pk, celery_fanout=False)
    fleet = Fleet.objects.get()
    form = {"text": "marmots and glaciers in the meadows", "rag_chunks": 4, "rag_docs": 2}
    page = admin_client.post(f"/admin/fleet/fleet/{fleet.pk}/query/", form).content.decode()
    picked = page[page.index('<ol id="picked">') : page.index("</ol>")]
    assert picked.count("<li>") == 2
    chunks = page[page.index('<table id="top-chunks">') : page.index("</table>", page.index("top-chunks"))]
    assert chunks.count("<tr>") == 1 + 4  # header + the top 4 chunks with their scores
    assert all(name in page for name in DOCS)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_build_fleet_fans_the_documents_out_to_the_celery_worker(
    celery_world, docs_dir, tmp_path, synthetic_dir
):
    model = synthetic_path("llama", synthetic_dir)
    args = [str(docs_dir), "--model", str(model), "--prefix-tokens", "8", "--embed-chunk", "16"]
    here = celery_world.manage("build_fleet", *args, "--out", str(tmp_path / "here"))
    there = celery_world.manage("build_fleet", *args, "--out", str(tmp_path / "there"), "--celery")
    assert here.returncode == 0 and there.returncode == 0, here.stderr + there.stderr
    a, b = (json.loads(p.stdout.strip().splitlines()[-1]) for p in (here, there))
    assert (a["documents"], a["chunks"]) == (b["documents"], b["chunks"]) == (3, a["chunks"])
    log = celery_world.worker_log.read_text()
    assert log.count("Task fleet.document_item[") >= 2 * 3  # received + succeeded, per document
    for doc in read_manifest(tmp_path / "there").documents:  # the workers wrote the same cartridges
        mine, theirs = (load_cartridge(tmp_path / side / doc.cartridge) for side in ("here", "there"))
        assert np.array_equal(mine.k, theirs.k) and np.array_equal(mine.v, theirs.v)
        assert (mine.fingerprint, mine.training) == (theirs.fingerprint, theirs.training)
    jobs = celery_world.rows("SELECT * FROM fleet_buildjob WHERE kind='fleet' ORDER BY id")
    assert [j["state"] for j in jobs[-2:]] == ["succeeded", "succeeded"] and "on Celery workers" in jobs[-1][
        "log"
    ]
