"""Admin pages of the fleet app's records: build jobs with progress, cartridges with their loss
curve and file, fleets with their documents and a "try a query" page.

Declarative ModelAdmins; the extra pages (start a build, cancel, download, try a query) are
admin views of their ModelAdmin (``get_urls``) that call the services.
"""

from __future__ import annotations

from pathlib import Path

from django.contrib import admin, messages
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_POST

from .forms import CartridgeBuildForm, FleetQueryForm
from .models import BuildJob, Cartridge, Document, Fleet
from .services import jobs
from .services.admin_builds import BuildRequestError, query_fleet, start_cartridge_build
from .services.lossplot import loss_curve_svg


def _bar(fraction: float) -> str:
    return format_html(
        '<progress value="{}" max="1"></progress> {}%', f"{fraction:.3f}", round(100 * fraction)
    )


def _mib(n: int | None) -> str:
    return "missing" if n is None else f"{n / 2**20:.2f} MiB"


class ReadOnlyMixin:
    """Rows are written by builds, never typed in."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(BuildJob)
class BuildJobAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = (
        "id",
        "kind",
        "state",
        "progress_bar",
        "steps_done",
        "loss",
        "held_out_loss",
        "conversations",
        "runner",
        "created",
        "duration",
    )
    list_filter = ("kind", "state", "runner")
    actions = ["cancel_jobs"]
    fields = (
        ("kind", "state", "runner"),
        "progress_bar",
        ("step", "total", "loss"),
        ("conversations", "coverage", "held_out_loss"),
        "error",
        "parameters",
        "result",
        ("created", "started", "finished"),
        ("celery_task_id", "process"),
        "cancel_requested",
        "log_text",
    )
    readonly_fields = ("progress_bar", "log_text")

    @admin.display(description="progress")
    def progress_bar(self, job: BuildJob) -> str:
        return _bar(job.progress)

    @admin.display(description="step")
    def steps_done(self, job: BuildJob) -> str:
        return f"{job.step}/{job.total}" if job.total else "-"

    @admin.display(description="seconds")
    def duration(self, job: BuildJob) -> str:
        return "-" if job.seconds is None else f"{job.seconds:.1f}"

    @admin.display(description="log")
    def log_text(self, job: BuildJob) -> str:
        return format_html(
            '<pre class="build-log" style="white-space: pre-wrap">{}</pre>', job.log or "(empty)"
        )

    @admin.action(description="Cancel the selected jobs")
    def cancel_jobs(self, request: HttpRequest, queryset) -> None:
        for job in queryset:
            self._cancel(request, job.pk)

    def _cancel(self, request: HttpRequest, job_id: int) -> None:
        try:
            outcome = jobs.cancel(job_id)
        except jobs.JobError as exc:
            self.message_user(request, str(exc), messages.WARNING)
        else:
            text = "cancelled" if outcome == "cancelled" else "asked to stop (it stops at its next check)"
            self.message_user(request, f"job #{job_id} {text}", messages.SUCCESS)

    def get_urls(self):
        cancel = self.admin_site.admin_view(require_POST(self.cancel_view))
        return [path("<int:job_id>/cancel/", cancel, name="fleet_buildjob_cancel"), *super().get_urls()]

    def cancel_view(self, request: HttpRequest, job_id: int) -> HttpResponse:
        self._cancel(request, job_id)
        return redirect("admin:fleet_buildjob_change", job_id)

    def changelist_view(self, request, extra_context=None):
        jobs.fail_orphans()
        return super().changelist_view(request, extra_context)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        jobs.fail_orphans()
        job = self.get_object(request, object_id)
        extra = {"job_running": job is not None and not job.is_finished, **(extra_context or {})}
        return super().change_view(request, object_id, form_url, extra)


@admin.register(Cartridge)
class CartridgeAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = (
        "name",
        "status",
        "rows",
        "steps",
        "loss_first",
        "loss_last",
        "size",
        "fingerprint",
        "created",
    )
    list_filter = ("status",)
    search_fields = ("path", "corpus_name")
    fields = (
        ("path", "status"),
        ("rows", "steps"),
        ("model_path", "model_fingerprint"),
        ("corpus_name", "corpus_digest"),
        ("loss_first", "loss_last"),
        "loss_curve",
        "download",
        "job",
        "created",
    )
    readonly_fields = ("loss_curve", "download")

    @admin.display(description="file")
    def name(self, cartridge: Cartridge) -> str:
        return str(cartridge)

    @admin.display(description="size")
    def size(self, cartridge: Cartridge) -> str:
        return _mib(cartridge.file_bytes)

    @admin.display(description="model")
    def fingerprint(self, cartridge: Cartridge) -> str:
        return cartridge.model_fingerprint[:12]

    @admin.display(description="loss curve")
    def loss_curve(self, cartridge: Cartridge) -> str:
        # Server-drawn from numbers only (the title is escaped): safe to inline.
        svg = loss_curve_svg(cartridge.loss_history, f"{cartridge} loss", cartridge.held_out_history)
        return mark_safe(svg)

    @admin.display(description="file")
    def download(self, cartridge: Cartridge) -> str:
        if cartridge.file_bytes is None:
            return "the file is missing"
        url = reverse("admin:fleet_cartridge_download", args=[cartridge.pk])
        return format_html(
            '<a class="download" href="{}">Download {} ({})</a>', url, cartridge, self.size(cartridge)
        )

    def get_urls(self):
        view = self.admin_site.admin_view
        return [
            path("build/", view(self.build_view), name="fleet_cartridge_build"),
            path("<int:pk>/download/", view(self.download_view), name="fleet_cartridge_download"),
            *super().get_urls(),
        ]

    def download_view(self, request: HttpRequest, pk: int) -> FileResponse:
        cartridge = get_object_or_404(Cartridge, pk=pk)
        try:
            handle = Path(cartridge.path).open("rb")
        except OSError as exc:
            raise Http404(f"{cartridge}: the file cannot be read ({exc.strerror})") from exc
        return FileResponse(handle, as_attachment=True, filename=str(cartridge))

    def build_view(self, request: HttpRequest) -> HttpResponse:
        """The form that starts a build from an uploaded corpus."""
        form = CartridgeBuildForm(request.POST or None, request.FILES or None)
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            options = {k: data[k] for k in ("prefix_tokens", "steps", "minutes", "lr", "seed")}
            try:
                job = start_cartridge_build(data["corpus"], data["name"], data["model"], **options)
            except BuildRequestError as exc:
                form.add_error(None, str(exc))
            else:
                self.message_user(request, f"build job #{job.pk} started ({job.runner})", messages.SUCCESS)
                return redirect("admin:fleet_buildjob_change", job.pk)
        context = {**self.admin_site.each_context(request), "title": "Start a cartridge build", "form": form}
        context["opts"] = self.model._meta
        return TemplateResponse(request, "admin/fleet/cartridge/build.html", context)


class DocumentInline(admin.TabularInline):
    model = Document
    fields = ("name", "tokens", "steps", "chunks", "cartridge_file", "size")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    @admin.display(description="cartridge size")
    def size(self, document: Document) -> str:
        return _mib(document.cartridge_bytes)


@admin.register(Fleet)
class FleetAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = (
        "__str__",
        "documents_count",
        "chunks",
        "prefix_tokens",
        "steps",
        "fingerprint",
        "query_link",
    )
    fields = (
        "directory",
        ("model_path", "model_fingerprint"),
        ("prefix_tokens", "steps"),
        ("documents_count", "chunks"),
        "job",
        "created",
        "query_link",
    )
    readonly_fields = ("query_link",)
    inlines = [DocumentInline]

    @admin.display(description="model")
    def fingerprint(self, fleet: Fleet) -> str:
        return fleet.model_fingerprint[:12]

    @admin.display(description="retrieval")
    def query_link(self, fleet: Fleet) -> str:
        return format_html(
            '<a href="{}">Try a query</a>', reverse("admin:fleet_fleet_query", args=[fleet.pk])
        )

    def get_urls(self):
        query = self.admin_site.admin_view(self.query_view)
        return [path("<int:pk>/query/", query, name="fleet_fleet_query"), *super().get_urls()]

    def query_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        """Retrieval on this fleet for a typed text: the top chunks' scores, the documents picked."""
        fleet = get_object_or_404(Fleet, pk=pk)
        form = FleetQueryForm(request.POST or None)
        result = None
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                result = query_fleet(fleet, data["text"], data["rag_chunks"], data["rag_docs"])
            except (ValueError, OSError) as exc:  # an empty text, an unreadable fleet directory
                form.add_error(None, str(exc))
        context = {
            **self.admin_site.each_context(request),
            "title": f"Try a query on {fleet}",
            "opts": self.model._meta,
            "original": fleet,
            "form": form,
            "result": result,
        }
        return TemplateResponse(request, "admin/fleet/fleet/query.html", context)


@admin.register(Document)
class DocumentAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ("name", "fleet", "tokens", "steps", "chunks", "size")
    list_filter = ("fleet",)
    search_fields = ("name",)

    @admin.display(description="cartridge size")
    def size(self, document: Document) -> str:
        return _mib(document.cartridge_bytes)
