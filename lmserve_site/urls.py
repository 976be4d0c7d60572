"""Plain Django URLs: the admin. The API endpoints are routed by Channels (asgi.py)."""

from django.contrib import admin
from django.urls import include, path

admin.site.site_url = None  # no "view site" link: "/" is the API's JSON 404, not a site

urlpatterns = [
    path("admin/kv/", include("fleet.urls")),
    path("admin/", admin.site.urls),
]
