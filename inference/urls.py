"""The KV admin pages, mounted under /admin/kv/ (staff only)."""

from django.contrib import admin
from django.urls import path

from . import views

app_name = "inference"
urlpatterns = [
    path("", admin.site.admin_view(views.kv_overview), name="kv"),
    path("slots/<int:index>/evict/", admin.site.admin_view(views.evict_slot), name="evict-slot"),
    path("sidecars/<str:name>/delete/", admin.site.admin_view(views.delete_sidecar), name="delete-sidecar"),
]
