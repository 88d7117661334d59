"""A worker survives its PostgreSQL server restarting under it.

The test starts a private PostgreSQL server on its own port and data directory (never the
machine's shared one), so restarting it disturbs nothing else.
"""

import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from tests.conftest import ROOT, subprocess_env

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("RWS_TEST_DB", "sqlite") != "postgres", reason="restarts a private PostgreSQL server"
    ),
]

PORT = "54329"


def _pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        pytest.skip(f"{name} not found")
    return found[-1]


def _as_postgres(*cmd: str) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else list(cmd)


@pytest.fixture
def private_pg():
    datadir = tempfile.mkdtemp(prefix="rws-pg-")
    if os.geteuid() == 0:
        shutil.chown(datadir, "postgres", "postgres")
    ctl = _pg_bin("pg_ctl")
    subprocess.run(
        _as_postgres(_pg_bin("initdb"), "-D", datadir, "-A", "trust", "-U", "postgres"),
        check=True,
        capture_output=True,
    )
    opts = f"-p {PORT} -k {datadir} -c listen_addresses=127.0.0.1 -c fsync=off"
    start = _as_postgres(ctl, "-D", datadir, "-o", opts, "-l", f"{datadir}/log", "-w", "start")
    subprocess.run(start, check=True, capture_output=True)
    try:
        subprocess.run(
            ["psql", "-h", "127.0.0.1", "-p", PORT, "-U", "postgres", "-c", "CREATE DATABASE rws_restart"],
            check=True,
            capture_output=True,
        )
        yield {
            "restart": lambda: subprocess.run(
                _as_postgres(
                    ctl, "-D", datadir, "-o", opts, "-l", f"{datadir}/log", "-m", "fast", "-w", "restart"
                ),
                check=True,
                capture_output=True,
            )
        }
    finally:
        subprocess.run(_as_postgres(ctl, "-D", datadir, "-m", "immediate", "stop"), capture_output=True)
        shutil.rmtree(datadir, ignore_errors=True)


def _psql(sql: str) -> str:
    out = subprocess.run(
        ["psql", "-h", "127.0.0.1", "-p", PORT, "-U", "postgres", "-d", "rws_restart", "-Atc", sql],
        capture_output=True,
        text=True,
    )
    return out.stdout.strip() if out.returncode == 0 else ""


@pytest.fixture
def port(private_pg):
    """The private server's port, or (RWS_TEST_POOLER=pgbouncer) a PgBouncer's in front of it."""
    if not os.environ.get("RWS_TEST_POOLER"):
        yield {"PGPORT": PORT}
        return
    from tests.pgbouncer import PgBouncer, free_port

    bouncer = PgBouncer(free_port(), int(PORT))
    yield {"RWS_TEST_PGBOUNCER_PORT": str(bouncer.port)}
    bouncer.stop()


def test_worker_carries_on_after_postgres_restarts(private_pg, port, tmp_path):
    env = subprocess_env(
        **port,
        RWS_TEST_DB_NAME="rws_restart",
        RWS_TEST_JOBS='{"LEASE_SECONDS": 5, "RECOVERY_INTERVAL": 1}',
    )
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "--run-syncdb", "-v0"], cwd=ROOT, env=env, check=True
    )
    n = 300
    code = (
        "import django; django.setup()\n"
        "from django_rws_jobs import enqueue\n"
        f"for i in range({n}): enqueue('test.slow_record', str(i), max_retries=20)\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True)
    log = tmp_path / "worker.log"
    worker = subprocess.Popen(
        [sys.executable, "-m", "django", "rws_worker", "--workers", "2"],
        cwd=ROOT,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and int(_psql("SELECT count(*) FROM testapp_run") or 0) < 20:
            time.sleep(0.05)
        private_pg["restart"]()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and _psql("SELECT count(*) FROM rws_jobs") != "0":
            time.sleep(0.2)
        assert _psql("SELECT count(*) FROM rws_jobs") == "0", log.read_text()[-3000:]
        done = _psql("SELECT count(DISTINCT payload) FROM testapp_run")
        assert done == str(n), log.read_text()[-3000:]
        assert worker.poll() is None, "the worker died:\n" + log.read_text()[-3000:]
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
    output = log.read_text()
    assert "database error while" in output, output[-3000:]  # it did see the restart
