"""The KV tiers' admin pages: live resident slots and sidecar files, with evict and delete.

They show the server's runtime state, not database records: slots are read from the worker
through the process's InferenceService, sidecars from the --kv-cache-dir directory. The views
sit behind the admin site's staff login (``admin.site.admin_view``).
"""

from __future__ import annotations

from datetime import UTC, datetime

from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.views.decorators.http import require_POST

from inference.runtime import service as services


def _when(timestamp: float | None) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if timestamp else "never"


def kv_overview(request: HttpRequest) -> HttpResponse:
    """Both tiers on one page."""
    service = services.current()
    slots = [
        {**s, "last_used_text": _when(s["last_used"]), "mib": s["bytes"] / 2**20}
        for s in service.kv_slots_status()
    ]
    sidecars = [
        {**f, "last_used_text": _when(f["last_used"]), "mib": f["bytes"] / 2**20}
        for f in service.kv_sidecars()
    ]
    context = {
        **admin.site.each_context(request),
        "title": "KV cache",
        "model": service.model_id,
        "state": service.state,
        "slots": slots,
        "sidecars": sidecars,
        "kv_cache_dir": service.kv_cache_dir,
        "kv_reuse": service.kv_reuse,  # None until loaded; False: every request starts afresh
    }
    return TemplateResponse(request, "inference/kv_admin.html", context)


@require_POST
def evict_slot(request: HttpRequest, index: int) -> HttpResponse:
    try:
        outcome = services.current().evict_kv_slot(index)
    except IndexError as exc:
        messages.error(request, str(exc))
    else:
        text = "evicted" if outcome == "evicted" else "will be evicted when its generation ends"
        messages.success(request, f"KV slot {index} {text}")
    return redirect("inference:kv")


@require_POST
def delete_sidecar(request: HttpRequest, name: str) -> HttpResponse:
    if services.current().delete_kv_sidecar(name):
        messages.success(request, f"sidecar {name} deleted")
    else:
        messages.error(request, f"no sidecar named {name}")
    return redirect("inference:kv")
