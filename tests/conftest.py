import os
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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A plain ``pytest`` is the fast lane: when pytest picks the tests itself (no paths given), the
    tests marked slow are left out unless ``--all`` or a ``-m`` expression asks for them. Naming a
    file or a test runs it whole."""
    if not _fast_lane(config):
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]


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
