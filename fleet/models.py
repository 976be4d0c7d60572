"""The fleet app's records: cartridges and fleets that were built, and the jobs that build them.

The files themselves (cartridges, fleet directories) live on disk; these rows say where, for which
model, and how they were made. A :class:`BuildJob` is the one record of a build whether it ran in
the command's process, in a thread of the server or on a Celery worker: the build writes its
progress, running loss and log here while it runs, and the admin reads them.
"""

from __future__ import annotations

from pathlib import Path

from django.db import models
from django.utils import timezone


class BuildJob(models.Model):
    """One build of a cartridge or a fleet, from queued to its end."""

    class Kind(models.TextChoices):
        CARTRIDGE = "cartridge"
        FLEET = "fleet"

    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"

    FINISHED = (State.SUCCEEDED, State.FAILED, State.CANCELLED)

    kind = models.CharField(max_length=16, choices=Kind.choices)
    parameters = models.JSONField(default=dict, help_text="the build's arguments (paths, steps, lr, ...)")
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED, db_index=True)
    progress = models.FloatField(default=0.0, help_text="0..1")
    step = models.PositiveIntegerField(default=0)
    total = models.PositiveIntegerField(default=0)
    loss = models.FloatField(null=True, blank=True, help_text="the latest running loss")
    conversations = models.PositiveIntegerField(default=0, help_text="self-study conversations synthesised")
    coverage = models.FloatField(default=0.0, help_text="their supervised spans / the corpus's tokens")
    held_out_loss = models.FloatField(null=True, blank=True, help_text="the latest held-out loss")
    log = models.TextField(blank=True, default="")
    error = models.TextField(blank=True, default="", help_text="why it failed or was cancelled")
    result = models.JSONField(null=True, blank=True, help_text="the build's JSON summary")
    runner = models.CharField(max_length=16, default="in-process", help_text="in-process, thread or celery")
    celery_task_id = models.CharField(max_length=64, blank=True, default="")
    process = models.CharField(max_length=128, blank=True, default="", help_text="host:pid running it")
    cancel_requested = models.BooleanField(default=False)
    created = models.DateTimeField(auto_now_add=True)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.kind} job #{self.pk} ({self.state})"

    @property
    def is_finished(self) -> bool:
        return self.state in self.FINISHED

    @property
    def seconds(self) -> float | None:
        """Wall time from start to end (or to now while running)."""
        if self.started is None:
            return None
        return ((self.finished or timezone.now()) - self.started).total_seconds()


class Cartridge(models.Model):
    """A cartridge file and how it was made."""

    class Status(models.TextChoices):
        BUILDING = "building"
        READY = "ready"
        FAILED = "failed"

    path = models.CharField(max_length=1024, unique=True, help_text="the .safetensors file")
    model_path = models.CharField(max_length=1024, blank=True, default="")
    model_fingerprint = models.CharField(max_length=32, blank=True, default="", help_text="hex, 16 bytes")
    rows = models.PositiveIntegerField(default=0, help_text="p: the prefix's rows")
    corpus_name = models.CharField(max_length=255, blank=True, default="")
    corpus_digest = models.CharField(max_length=64, blank=True, default="", help_text="sha256 of the corpus")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.BUILDING)
    steps = models.PositiveIntegerField(default=0)
    loss_history = models.JSONField(default=list, blank=True, help_text="[[step, loss], ...]")
    held_out_history = models.JSONField(default=list, blank=True, help_text="[[step, held-out loss], ...]")
    loss_first = models.FloatField(null=True, blank=True)
    loss_last = models.FloatField(null=True, blank=True)
    job = models.ForeignKey(BuildJob, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return Path(self.path).name

    @property
    def file_bytes(self) -> int | None:
        """The file's size, or None when it is gone."""
        try:
            return Path(self.path).stat().st_size
        except OSError:
            return None


class Fleet(models.Model):
    """A fleet directory: one cartridge per document plus the retrieval index."""

    directory = models.CharField(max_length=1024, unique=True)
    model_path = models.CharField(max_length=1024, blank=True, default="")
    model_fingerprint = models.CharField(max_length=32, blank=True, default="")
    prefix_tokens = models.PositiveIntegerField(default=0, help_text="p of each document's cartridge")
    documents_count = models.PositiveIntegerField(default=0)
    chunks = models.PositiveIntegerField(default=0, help_text="index chunks over all documents")
    steps = models.PositiveIntegerField(default=0)
    job = models.ForeignKey(BuildJob, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return Path(self.directory).name or self.directory


class Document(models.Model):
    """One document of a fleet and its cartridge."""

    fleet = models.ForeignKey(Fleet, on_delete=models.CASCADE, related_name="documents")
    name = models.CharField(max_length=255)
    tokens = models.PositiveIntegerField(default=0)
    steps = models.PositiveIntegerField(default=0)
    cartridge_file = models.CharField(max_length=1024, help_text="relative to the fleet directory")
    cartridge_bytes = models.PositiveBigIntegerField(default=0)
    chunks = models.PositiveIntegerField(default=0, help_text="index chunks of this document")

    class Meta:
        ordering = ["fleet", "name"]
        constraints = [models.UniqueConstraint(fields=["fleet", "name"], name="unique_document_per_fleet")]

    def __str__(self) -> str:
        return self.name
