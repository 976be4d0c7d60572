"""Plain Django URLs: the admin. The API endpoints are routed by Channels (asgi.py)."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/kv/", include("fleet.urls")),
    path("admin/", admin.site.urls),
]
