"""Plain Django URLs: the chat page and the admin. The API endpoints are routed by Channels
(asgi.py)."""

from django.contrib import admin
from django.urls import include, path

from api.pages import chat_page

admin.site.site_url = "/"  # the admin's "view site" link opens the chat page

urlpatterns = [
    path("", chat_page, name="chat"),
    path("admin/kv/", include("inference.urls")),
    path("admin/", admin.site.urls),
]
