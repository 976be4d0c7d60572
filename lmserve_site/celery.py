"""Celery app for offline builds (cartridges, fleets); broker from CELERY_BROKER_URL."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lmserve_site.settings")

app = Celery("lmserve")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
