"""The Celery app for offline builds (cartridges, fleets): ``celery -A lmserve_site.celery worker``.

Its configuration is Django's settings under the ``CELERY_`` namespace (the broker from
``CELERY_BROKER_URL``), read when the app is first configured, not when this module is imported;
tasks are the ``tasks`` modules of the installed apps (``fleet/tasks.py``). Whether a broker is
configured at all is :func:`fleet.services.jobs.broker_configured`: without one, nothing is sent
here and builds run in-process.
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lmserve_site.settings")

app = Celery("lmserve")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
