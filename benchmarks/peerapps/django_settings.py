"""Django settings of the Django-based peers in benchmarks/peers.py (run in .venv/peers):
RWS_BENCH_DJANGO_PEER=procrastinate|ox|tasks_db picks the peer, RWS_BENCH_DJANGO_PEERS_DB its
database (a PostgreSQL database's name, or a path ending in .sqlite3); beside it the one contrib
app ours has in benchmarks/settings.py."""

import os

from benchmarks.databases import postgres

PEER = os.environ["RWS_BENCH_DJANGO_PEER"]
NAME = os.environ["RWS_BENCH_DJANGO_PEERS_DB"]
SECRET_KEY = "bench"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    *{
        "procrastinate": ["procrastinate.contrib.django", "benchmarks.peerapps.procrastinate_app"],
        "ox": ["django_ox", "benchmarks.peerapps.tasks_app"],
        "tasks_db": ["django_tasks_db", "benchmarks.peerapps.tasks_app"],
    }[PEER],
]
if NAME.endswith(".sqlite3"):  # in WAL mode, as ours runs SQLite
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": NAME,
            "OPTIONS": {"init_command": "PRAGMA journal_mode=WAL"},
        }
    }
else:
    DATABASES = {"default": postgres(NAME)}
if PEER == "ox":
    TASKS = {"default": {"BACKEND": "django_ox.backend.OxBackend"}}
elif PEER == "tasks_db":
    TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["stderr"], "level": "WARNING"},
}
