"""Django settings for lmserve.

Everything a deployment changes comes from the environment: ``LMSERVE_MODEL`` (the GGUF to
serve; the default model when unset), ``LMSERVE_MODELS_DIR`` (where ``fetch_models`` puts
the optional models), ``LMSERVE_DATA_DIR`` (the SQLite database and the generated secret key;
the checkout by default), ``DATABASE_URL`` (SQLite by default), ``LMSERVE_SECRET_KEY`` (else
a key generated once per installation), ``LMSERVE_ALLOWED_HOSTS`` (comma-separated, on top of
the localhost names; ``manage.py lmserve`` adds its --host and --allowed-hosts),
``CELERY_BROKER_URL`` (Redis for offline builds on Celery workers; unset, builds run in-process).
"""

import os
from pathlib import Path

from lmserve_site.secret import installation_secret

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("LMSERVE_DATA_DIR") or BASE_DIR)

SECRET_KEY = os.environ.get("LMSERVE_SECRET_KEY") or installation_secret(DATA_DIR / ".secret_key")
DEBUG = os.environ.get("LMSERVE_DEBUG", "") == "1"
# Only names this server is reached by: a DNS-rebinding page reaches 127.0.0.1 under its own.
LOCAL_HOSTS = ["localhost", ".localhost", "127.0.0.1", "[::1]"]
ALLOWED_HOSTS = LOCAL_HOSTS + [
    h.strip() for h in os.environ.get("LMSERVE_ALLOWED_HOSTS", "").split(",") if h.strip()
]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "api",
    "inference",
    "fleet",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "lmserve_site.urls"
ASGI_APPLICATION = "lmserve_site.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]


def _database():
    url = os.environ.get("DATABASE_URL", "")
    if url.startswith(("postgres://", "postgresql://")):
        from urllib.parse import urlparse

        u = urlparse(url)
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": u.path.lstrip("/"),
            "USER": u.username or "",
            "PASSWORD": u.password or "",
            "HOST": u.hostname or "",
            "PORT": str(u.port or ""),
        }
    return {"ENGINE": "django.db.backends.sqlite3", "NAME": DATA_DIR / "db.sqlite3"}


DATABASES = {"default": _database()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
# The admin's CSS and JavaScript, served by WhiteNoise from the installed apps' static folders
# (no collectstatic step: WHITENOISE_USE_FINDERS), under any server, DEBUG or not.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# The model served; resolved lazily (inference.model_files.resolve_model, when the service
# starts) so settings stay cheap.
LMSERVE_MODEL = os.environ.get("LMSERVE_MODEL", "")
LMSERVE_MODELS_DIR = Path(os.environ.get("LMSERVE_MODELS_DIR", BASE_DIR / "models"))
# Where builds started from the admin keep their uploaded corpora and write their cartridges
# (Celery workers on other machines must see the same directory).
LMSERVE_BUILD_DIR = Path(os.environ.get("LMSERVE_BUILD_DIR") or DATA_DIR / "builds")

# Offline builds (cartridges, fleets) go to Celery workers only when a broker is configured
# (Redis: ``redis://host:6379/0``); unset, every build runs in-process (the embedded default).
# Results (the fleet builds' per-document fan-out waits on them) go to the same Redis by default.
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "")
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND", "") or CELERY_BROKER_URL
CELERY_TASK_SERIALIZER = CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
# A build runs for minutes: a worker takes one task at a time and acknowledges it when done. A
# worker that dies mid-build has its job marked failed (fleet/tasks.py); a redelivered message
# finds the job no longer queued and does nothing.
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ACKS_LATE = True
# A build's state lives in the database, not the broker: it runs on through a broker outage
# (its message is acknowledged, or redelivered and ignored, once the broker is back).
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False

# KV prefix sources by flag (`lmserve --cartridge F` calls the "cartridge" factory with F,
# `--fleet DIR` the "fleet" factory with DIR and the --rag-* options): the
# fleet app implements them, and `inference` reaches them only through this setting.
LMSERVE_PREFIX_SOURCES = {
    "cartridge": "fleet.sources.CartridgeSource",
    "fleet": "fleet.fleets.source.FleetSource",
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "lmserve": {"handlers": ["console"], "level": os.environ.get("LMSERVE_LOG_LEVEL", "INFO")},
        # Errors inside Django views (the admin's 500s, refused hosts) with their tracebacks.
        "django.request": {"handlers": ["console"], "level": "ERROR", "propagate": False},
        "django.security": {"handlers": ["console"], "level": "WARNING", "propagate": False},
    },
}
