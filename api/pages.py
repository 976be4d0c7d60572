"""The chat page at ``/``: a Django template plus plain JavaScript (api/static/lmserve/), no
build step and nothing fetched from elsewhere.

The page holds no secret and is served without the API key: a browser cannot attach a bearer
key to a page visit, and everything the page does goes through the API endpoints, which take
the key the user types into the page (kept in the browser's localStorage).
"""

from __future__ import annotations

from django.shortcuts import render
from django.views.decorators.http import require_GET

# Everything the page loads is its own: scripts, styles and API calls go to this origin only.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


@require_GET
def chat_page(request):
    """The chat page; what it shows (model, capabilities, replies) it fetches from the API."""
    response = render(request, "lmserve/chat.html")
    response["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    response["Referrer-Policy"] = "no-referrer"
    return response
