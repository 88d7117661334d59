"""Test settings: RWS_TEST_DB=sqlite|postgres|mysql picks the database (default sqlite);
RWS_TEST_MYSQL_DRIVER=pymysql runs MariaDB through PyMySQL instead of mysqlclient (worker
processes started by the tests inherit both)."""

import json
import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
TMP = Path(os.environ.get("RWS_TEST_TMP", HERE / ".tmp"))
TMP.mkdir(exist_ok=True)

SECRET_KEY = "tests-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]
# A fast hasher for the admin tests' users (Django's advice for test settings): the default
# PBKDF2 took most of each admin test's set-up.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

DB = os.environ.get("RWS_TEST_DB", "sqlite")
# Subprocesses started by the tests point at the test database the test run created.
NAME_OVERRIDE = os.environ.get("RWS_TEST_DB_NAME")

if DB == "sqlite":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": NAME_OVERRIDE or str(TMP / "main.sqlite3"),
            # A file, not memory: the tests start worker processes that share it.
            "TEST": {"NAME": str(TMP / f"test-{os.getpid()}.sqlite3")},
        }
    }
elif DB == "postgres":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": NAME_OVERRIDE or "rws_jobs",
            "USER": os.environ.get("PGUSER", "postgres"),
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
            "TEST": {"NAME": f"test_rws_jobs_{os.getpid()}"},
        }
    }
elif DB == "mysql":
    if os.environ.get("RWS_TEST_MYSQL_DRIVER") == "pymysql":
        import pymysql

        # Django asks MySQLdb for mysqlclient's version; PyMySQL before 1.1.1 claims an old one.
        if pymysql.version_info < (2, 2, 1):
            pymysql.version_info = (2, 2, 1, "final", 0)
        pymysql.install_as_MySQLdb()
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.mysql",
            "NAME": NAME_OVERRIDE or "rws_jobs",
            "USER": os.environ.get("MYSQL_USER", "root"),
            "PASSWORD": os.environ.get("MYSQL_PASSWORD", ""),
            "HOST": os.environ.get("MYSQL_HOST", "127.0.0.1"),
            "PORT": os.environ.get("MYSQL_PORT", "3306"),
            "OPTIONS": {"charset": "utf8mb4"},
            # Created with the server's default collation (utf8mb4_general_ci on MariaDB), as a
            # user's database is: the queue's columns must compare exactly anyway (migration 0007).
            "TEST": {"NAME": f"test_rws_jobs_{os.getpid()}"},
        }
    }
else:
    raise RuntimeError(f"RWS_TEST_DB={DB!r}: use sqlite, postgres or mysql")

# RWS_TEST_POOLER=pgbouncer: the run and its workers reach PostgreSQL through PgBouncer in
# transaction mode on RWS_TEST_PGBOUNCER_PORT (started by tests/conftest.py), told as Django's
# docs ask of such projects.
POOLER = os.environ.get("RWS_TEST_POOLER")
PGBOUNCER_PORT = int(os.environ.get("RWS_TEST_PGBOUNCER_PORT", "6439"))
if POOLER == "pgbouncer":
    if DB != "postgres":
        raise RuntimeError("RWS_TEST_POOLER=pgbouncer needs RWS_TEST_DB=postgres")
    DATABASES["default"]["PORT"] = str(PGBOUNCER_PORT)
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
elif POOLER:
    raise RuntimeError(f"RWS_TEST_POOLER={POOLER!r}: use pgbouncer or leave it unset")
# tests/test_pooler.py's workers: Django told of the pooler, and an alias that bypasses it.
if os.environ.get("RWS_TEST_DISABLE_SERVER_SIDE_CURSORS"):
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
if os.environ.get("RWS_TEST_DIRECT_PORT"):
    DATABASES["direct"] = {
        **DATABASES["default"],
        "PORT": os.environ["RWS_TEST_DIRECT_PORT"],
        "DISABLE_SERVER_SIDE_CURSORS": False,
        "TEST": {"MIRROR": "default"},
    }

# tests/test_worker.py's worker beside a database that is down: a MariaDB alias on a port where
# nothing listens (a MariaDB one, since Django's model checks connect to it to learn its version).
if os.environ.get("RWS_TEST_DOWN_ALIAS"):
    DATABASES["reports"] = {
        "ENGINE": "django.db.backends.mysql",
        "HOST": "127.0.0.1",
        "PORT": os.environ["RWS_TEST_DOWN_ALIAS"],
        "NAME": "reports",
        "USER": "reports",
    }

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_rws_jobs",
    "tests.testapp",
]
try:  # Django 6 has django.tasks; on Django 5.2 the backport is an app (the "tasks" extra)
    import django.tasks  # noqa: F401
except ImportError:
    try:
        import django_tasks  # noqa: F401

        INSTALLED_APPS.append("django_tasks")
    except ImportError:
        pass
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
STATIC_URL = "/static/"

TASKS = {
    "default": {
        "BACKEND": "django_rws_jobs.tasks.RwsJobsBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": json.loads(os.environ.get("RWS_TEST_TASK_OPTIONS", "{}")),
    }
}

RWS_JOBS = {
    "BACKOFF_INITIAL": 0.5,
    "POLL_INTERVAL": 0.1,
    "LEASE_SECONDS": int(os.environ.get("RWS_TEST_LEASE", "60")),
}
# Worker processes started by the tests get their settings from the test (JSON).
RWS_JOBS.update(json.loads(os.environ.get("RWS_TEST_JOBS", "{}")))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "loggers": {
        "django_rws_jobs": {"handlers": ["stderr"], "level": os.environ.get("RWS_LOG_LEVEL", "WARNING")},
    },
}

if os.environ.get("RWS_TEST_OTEL_FILE"):  # a worker of tests/test_tracing.py: its spans to a file
    from tests.otel_file import configure

    configure(os.environ["RWS_TEST_OTEL_FILE"])
