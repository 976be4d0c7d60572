"""ASGI entry point: Channels routes the API paths to their consumers, the rest to Django.

Importing this module loads no model: the inference service starts when the ``lmserve``
command installs it, or on the first request (``manage.py runserver``).
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lmserve_site.settings")
django_asgi_app = get_asgi_application()

from api.routing import build_application  # noqa: E402  (needs Django set up first)

application = build_application(django_asgi_app)
