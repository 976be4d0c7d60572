"""Plain Django URLs: the admin. The API endpoints are routed by Channels (asgi.py)."""

from django.contrib import admin
from django.urls import path

urlpatterns = [
    path("admin/", admin.site.urls),
]
