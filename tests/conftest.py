import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--all",
        action="store_true",
        default=False,
        help="also run the tests marked slow (scripts/test and CI pass it)",
    )
    parser.addoption(
        "--slow-modules",
        default=None,
        help="with --all, run the slow tests of these test files only (comma-separated names, "
        "e.g. test_worker.py,test_migrations.py): scripts/test's cells for the older Django",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A plain ``pytest`` is the fast lane: when pytest picks the tests itself (no paths given), the
    tests marked slow are left out unless ``--all`` or a ``-m`` expression asks for them. Naming a
    file or a test runs it whole."""
    only = config.getoption("--slow-modules")
    if _fast_lane(config):
        slow = [item for item in items if item.get_closest_marker("slow")]
    elif only:
        keep = set(only.split(","))
        slow = [item for item in items if item.get_closest_marker("slow") and item.path.name not in keep]
    else:
        return
    if slow:
        config.hook.pytest_deselected(items=slow)
        left_out = set(slow)
        items[:] = [item for item in items if item not in left_out]


_pgbouncer = None


def pytest_configure(config: pytest.Config) -> None:
    """RWS_TEST_POOLER=pgbouncer: start PgBouncer where tests/settings.py points the run."""
    global _pgbouncer
    if os.environ.get("RWS_TEST_POOLER") != "pgbouncer":
        return
    from django.conf import settings

    from tests.pgbouncer import PgBouncer

    try:
        socket.create_connection(("127.0.0.1", settings.PGBOUNCER_PORT), timeout=1).close()
        return  # one is running there already (a run of scripts/repeat left it, or its owner)
    except OSError:
        pass
    _pgbouncer = PgBouncer(settings.PGBOUNCER_PORT, int(os.environ.get("PGPORT", "5432")))


def pytest_unconfigure(config: pytest.Config) -> None:
    if _pgbouncer is not None:
        _pgbouncer.stop()


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """pytest-django's, and behind PgBouncer its server connections to the test database closed
    before the database is dropped (DROP DATABASE refuses a database in use)."""
    yield
    if os.environ.get("RWS_TEST_POOLER") == "pgbouncer":
        from django.conf import settings

        from tests.pgbouncer import admin

        admin(settings.PGBOUNCER_PORT, f"KILL {connection.settings_dict['NAME']}")


def pytest_report_header(config: pytest.Config) -> str | None:
    if _fast_lane(config):
        return "fast lane: tests marked slow are left out; `pytest --all` (or scripts/test) runs every test"
    return None


def _fast_lane(config: pytest.Config) -> bool:
    explicit = config.args_source == pytest.Config.ArgsSource.ARGS
    return not (config.getoption("--all") or config.getoption("markexpr") or explicit)


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for a child process that uses this test run's database."""
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="tests.settings",
        RWS_TEST_DB_NAME=connection.settings_dict["NAME"],
        PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    env.update(extra)
    return env


def start_worker(*args: str, env: dict[str, str] | None = None, **popen) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "django", "rws_worker", *args],
        cwd=ROOT,
        env=env or subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **popen,
    )


def run_python(code: str, *, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.Popen:
    """Start ``python -c code`` after django.setup() in a child process."""
    prelude = "import django; django.setup()\n"
    return subprocess.Popen(
        [sys.executable, "-c", prelude + code],
        cwd=ROOT,
        env=env or subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def short_lock_waits(store) -> None:
    """Make a Store's connection give up on a row lock at once (200 ms on PostgreSQL, 1 s on
    MariaDB, its least): a test that a transaction holds no lock in a worker's way then fails
    with the database's lock timeout instead of waiting."""
    with store.cursor() as c:
        c.execute(
            "SET lock_timeout = '200ms'"
            if store.conn.vendor == "postgresql"
            else "SET SESSION innodb_lock_wait_timeout = 1"
        )


def drain() -> int:
    """Run due jobs in this process (``tick()``) until none is left; how many ran."""
    import django_rws_jobs as rws

    n = 0
    while rws.tick():
        n += 1
    return n


@pytest.fixture
def runs():
    """Rows written by the test handlers, as (kind, payload) tuples in order."""
    from tests.testapp.models import Run

    def get(kind=None):
        qs = Run.objects.order_by("id")
        if kind:
            qs = qs.filter(kind=kind)
        return [(r.kind, r.payload) for r in qs]

    return get


@pytest.fixture
def started():
    """Worker processes a test started (tests.test_worker.WorkerProcess); killed at its end."""
    procs: list = []
    yield procs
    for w in procs:
        w.stop()
