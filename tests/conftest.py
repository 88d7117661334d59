import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent


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
        cwd=ROOT, env=env or subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        **popen,
    )


def run_python(code: str, *, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.Popen:
    """Start ``python -c code`` after django.setup() in a child process."""
    prelude = "import django; django.setup()\n"
    return subprocess.Popen(
        [sys.executable, "-c", prelude + code], cwd=ROOT, env=env or subprocess_env(),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
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
