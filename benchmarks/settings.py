"""Settings for benchmarks/run.py: RWS_BENCH_DB=sqlite|postgres|mysql."""

import json
import os
from pathlib import Path

from benchmarks.databases import postgres

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
RESULTS.mkdir(exist_ok=True)
SECRET_KEY = "bench"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django_rws_jobs", "benchmarks.benchapp"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DB = os.environ.get("RWS_BENCH_DB", "sqlite")
NAME = os.environ.get("RWS_BENCH_DB_NAME", "rws_bench")  # benchmarks/admin.py uses its own
if DB == "sqlite":
    DATABASES = {
        "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(RESULTS / f"{NAME}.sqlite3")}
    }
elif DB == "postgres":
    # RWS_BENCH_PGPORT: another port, such as run.py --pgbouncer's PgBouncer, which
    # RWS_BENCH_POOLER tells the queue of (Django's setting for transaction poolers).
    DATABASES = {
        "default": postgres(
            NAME,
            os.environ.get("RWS_BENCH_PGPORT", "5432"),
            DISABLE_SERVER_SIDE_CURSORS=bool(os.environ.get("RWS_BENCH_POOLER")),
        )
    }
elif DB == "mysql":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.mysql",
            "NAME": NAME,
            "USER": "root",
            "HOST": "127.0.0.1",
            "PORT": "3306",
            "OPTIONS": {"charset": "utf8mb4"},
        }
    }
else:
    raise RuntimeError(f"RWS_BENCH_DB={DB!r}")

TASKS = {"default": {"BACKEND": "django_rws_jobs.tasks.RwsJobsBackend"}}  # the tasks drain
RWS_JOBS = {"POLL_INTERVAL": 0.5}
RWS_JOBS.update(json.loads(os.environ.get("RWS_BENCH_JOBS", "{}")))
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "loggers": {"django_rws_jobs": {"handlers": ["stderr"], "level": "WARNING", "propagate": False}},
}
