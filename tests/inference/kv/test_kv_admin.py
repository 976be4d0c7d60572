"""The KV admin pages: live slots from the worker, sidecar files from the directory, actions."""

from __future__ import annotations

import pytest

from inference.runtime import service as services
from inference.runtime.service import InferenceService, ServeConfig
from inference.types import GenerationRequest, Message

pytestmark = pytest.mark.django_db


class Collect:
    """A sink that keeps what the backend streams."""

    cancelled = False

    def __init__(self):
        self.events, self.final = [], None

    def push(self, event) -> None:
        self.events.append(event)

    def close(self, final) -> None:
        self.final = final

    def prefix_chosen(self, documents) -> None:
        self.documents = documents


@pytest.fixture
def live_service(tmp_path):
    """A real service on the default model with two slots and a disk tier, installed as the
    process's server; one slot holds a conversation and one sidecar file holds a copy."""
    config = ServeConfig(ctx=512, kv_slots=2, kv_cache_dir=str(tmp_path / "kv"), kv_disk_slots=3)
    service = InferenceService.from_config(config)
    service.start()
    assert service.worker.ready.wait(600), service.worker.error
    backend = service.worker.backend
    request = GenerationRequest(messages=(Message("user", "Say hello."),), max_tokens=4)
    prepared = backend.validate(request)
    backend.generate(request, prepared, Collect())  # the worker is idle: safe from this thread
    backend.slots.release()
    cache = next(s.cache for s in backend.slots.slots if s.cache is not None and s.cache.tokens)
    backend.slots.disk.spill(cache)
    (tmp_path / "kv" / "broken.kv").write_bytes(b"not a sidecar at all")
    previous = services._current
    services.install(service)
    yield service
    services.install(previous)
    service.shutdown()
    service.queue.close()
    service.worker.join(30)


def test_admin_needs_a_staff_login(client, live_service):
    response = client.get("/admin/kv/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_overview_lists_live_slots_and_sidecar_files(admin_client, live_service):
    page = admin_client.get("/admin/kv/").content.decode()
    status = live_service.kv_slots_status()
    used = next(s for s in status if s["tokens"])
    assert len(status) == 2 and used["bytes"] > 0 and used["last_used"] is not None
    assert f"<td>{used['tokens']}</td>" in page
    (stored,) = [f for f in live_service.kv_sidecars() if "error" not in f]
    assert stored["tokens"] == used["tokens"] and stored["geometry"] == "30x3x64/64"
    assert stored["name"] in page and "broken.kv" in page and "unreadable" in page


def test_evict_slot_and_delete_sidecar(admin_client, live_service):
    used = next(s for s in live_service.kv_slots_status() if s["tokens"])
    response = admin_client.post(f"/admin/kv/slots/{used['index']}/evict/", follow=True)
    assert b"evicted" in response.content
    after = live_service.kv_slots_status()[used["index"]]
    assert after["tokens"] == 0 and after["bytes"] == 0
    (stored,) = [f for f in live_service.kv_sidecars() if "error" not in f]
    admin_client.post(f"/admin/kv/sidecars/{stored['name']}/delete/")
    names = {f["name"] for f in live_service.kv_sidecars()}
    assert names == {"broken.kv"}
    assert live_service.worker.backend.slots.disk.files == []
    assert admin_client.post("/admin/kv/sidecars/nothing.kv/delete/", follow=True).status_code == 200
    assert admin_client.get("/admin/kv/slots/0/evict/").status_code == 405


def test_slots_and_sidecars_behind_a_cartridge_show_its_key_and_rows(admin_client, tmp_path):
    from fleet.cartridges.file import save_cartridge
    from fleet.cartridges.init import initial_cartridge
    from fleet.sources import CartridgeSource
    from inference.engine.engine import Engine
    from inference.model_files import default_model_path

    cartridge = initial_cartridge(Engine.load(default_model_path()), [1, 9690, 198, 504, 3330, 2])
    source = CartridgeSource(save_cartridge(tmp_path / "c.safetensors", cartridge))
    config = ServeConfig(ctx=512, kv_slots=1, kv_cache_dir=str(tmp_path / "kv"))
    service = InferenceService.from_config(config, prefix_source=source)
    service.start()
    previous = services._current
    try:
        assert service.worker.ready.wait(600), service.worker.error
        backend = service.worker.backend
        request = GenerationRequest(messages=(Message("user", "Say hello."),), max_tokens=4)
        backend.generate(request, backend.validate(request), Collect())
        backend.slots.release()
        backend.slots.disk.spill(backend.slots.slots[0].cache)
        services.install(service)
        page = admin_client.get("/admin/kv/").content.decode()
        assert page.count(f"<td>{source.key} (6)</td>") == 2  # the slot and its sidecar
    finally:
        services.install(previous)
        service.shutdown()
        service.queue.close()
        service.worker.join(30)


@pytest.mark.slow
def test_a_model_without_kv_reuse_says_so_instead_of_listing_slots(admin_client, tmp_path):
    from tests.fixtures.synthetic_gguf import synthetic_path

    recurrent = synthetic_path("qwen35", tmp_path)
    service = InferenceService.from_config(ServeConfig(model=str(recurrent), ctx=256))
    service.start()
    previous = services._current
    try:
        assert service.worker.ready.wait(600), service.worker.error
        services.install(service)
        page = admin_client.get("/admin/kv/").content.decode()
        assert "keeps no KV rows across requests" in page and "not loaded yet" not in page
    finally:
        services.install(previous)
        service.shutdown()
        service.queue.close()
        service.worker.join(30)
