"""Django settings of the Django-based peers in benchmarks/peers.py (run in .venv/peers):
RWS_BENCH_DJANGO_PEER=procrastinate|ox picks the peer, on the PostgreSQL database
RWS_BENCH_DJANGO_PEERS_DB; beside it the one contrib app ours has in benchmarks/settings.py."""

import os

PEER = os.environ["RWS_BENCH_DJANGO_PEER"]
SECRET_KEY = "bench"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    *{
        "procrastinate": ["procrastinate.contrib.django", "benchmarks.peerapps.procrastinate_app"],
        "ox": ["django_ox", "benchmarks.peerapps.ox_app"],
    }[PEER],
]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ["RWS_BENCH_DJANGO_PEERS_DB"],
        "USER": "postgres",
        "HOST": "127.0.0.1",
        "PORT": "5432",
    }
}
if PEER == "ox":
    TASKS = {"default": {"BACKEND": "django_ox.backend.OxBackend"}}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["stderr"], "level": "WARNING"},
}
