"""Tables that rust-web-server created first are adopted by `migrate` with every row, and
its rows then run on our worker."""

import os
import subprocess
import sys
import time

import pytest
from django.db import connection, connections

from django_rws_jobs.api.enqueue import unique_hash
from tests.conftest import ROOT, start_worker, subprocess_env
from tests.settings import TMP

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]  # migrate in child processes

VENDOR = connection.vendor

# rust-web-server 18.36's ensure_tables(), verbatim.
RUST_JOBS = (
    "CREATE TABLE IF NOT EXISTS rws_jobs "
    "(id VARCHAR(64) PRIMARY KEY, job_type TEXT NOT NULL, payload TEXT NOT NULL, "
    "status VARCHAR(16) NOT NULL DEFAULT 'pending', attempts INTEGER NOT NULL DEFAULT 0, "
    "max_retries INTEGER NOT NULL DEFAULT 3, next_run_at BIGINT NOT NULL, "
    "created_at BIGINT NOT NULL, last_error TEXT, "
    "queue VARCHAR(64) NOT NULL DEFAULT 'default', priority BIGINT NOT NULL DEFAULT 0, "
    "unique_key VARCHAR(191))"
)
RUST_UPGRADE = [
    ("queue", "VARCHAR(64) NOT NULL DEFAULT 'default'"),
    ("priority", "BIGINT NOT NULL DEFAULT 0"),
    ("unique_key", "VARCHAR(191)"),
]
RUST_SCHEDULES = (
    "CREATE TABLE IF NOT EXISTS rws_job_schedules "
    "(name VARCHAR(191) PRIMARY KEY, next_run_at BIGINT NOT NULL)"
)
# Before 18.35: the same table without queue, priority and unique_key.
RUST_JOBS_9 = RUST_JOBS.split(", queue VARCHAR")[0] + ")"
# The form the 18.35 docs show (SQLite's types; on PostgreSQL INTEGER is 32 bits).
RUST_JOBS_DOC = (
    "CREATE TABLE IF NOT EXISTS rws_jobs (id TEXT PRIMARY KEY, job_type TEXT NOT NULL, "
    "payload TEXT NOT NULL DEFAULT '', status TEXT NOT NULL DEFAULT 'pending', "
    "attempts INTEGER NOT NULL DEFAULT 0, max_retries INTEGER NOT NULL DEFAULT 3, "
    "next_run_at INTEGER NOT NULL, created_at INTEGER NOT NULL, last_error TEXT)"
)
SEED_INSERT_9 = (
    "INSERT INTO rws_jobs (id, job_type, payload, status, attempts, max_retries, next_run_at, "
    "created_at, last_error) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
SEED_INSERT = (
    "INSERT INTO rws_jobs (id, job_type, payload, status, attempts, max_retries, next_run_at, "
    "created_at, queue, priority, unique_key) "
    "VALUES (%s, %s, %s, 'pending', 0, %s, %s, %s, %s, %s, %s)"
)

FORMS = {
    "v18_36": RUST_JOBS,
    "v18_34": RUST_JOBS_9,
    "v18_34_doc": RUST_JOBS_DOC,
}


class Database:
    """A database of its own for one test, reached from here and from child processes."""

    def __init__(self, form: str):
        self.name = (
            str(TMP / f"adopt-{os.getpid()}-{form}.sqlite3")
            if VENDOR == "sqlite"
            else f"rws_adopt_{os.getpid()}_{form}"
        )
        self._drop()
        if VENDOR != "sqlite":
            # With the server's default collation (utf8mb4_general_ci on MariaDB), as the crate's is.
            self._admin(f"CREATE DATABASE {self.name}")
        self.conn = connections.create_connection("default")
        self.conn.settings_dict = {**self.conn.settings_dict, "NAME": self.name}

    def _admin(self, sql: str) -> None:
        admin = connections.create_connection("default")
        admin.settings_dict = {**admin.settings_dict, "NAME": "postgres" if VENDOR == "postgresql" else ""}
        try:
            with admin.cursor() as c:
                c.execute(sql)
        finally:
            admin.close()

    def _drop(self) -> None:
        if VENDOR == "sqlite":
            for suffix in ("", "-wal", "-shm"):
                try:
                    os.unlink(self.name + suffix)
                except FileNotFoundError:
                    pass
        elif VENDOR == "postgresql":
            self._admin(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")
        else:
            self._admin(f"DROP DATABASE IF EXISTS {self.name}")

    def execute(self, sql: str, params=None):
        with self.conn.cursor() as c:
            c.execute(sql, params)
            return list(c.fetchall()) if c.description else c.rowcount

    def env(self) -> dict:
        return subprocess_env(RWS_TEST_DB_NAME=self.name)

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "django", *args],
            cwd=ROOT,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def close(self) -> None:
        self.conn.close()
        self._drop()


@pytest.fixture
def rust_db(request):
    created = []

    def make(form: str) -> Database:
        db = Database(form)
        created.append(db)
        return db

    yield make
    for db in created:
        db.close()


def forms():
    # Only SQLite and PostgreSQL take a TEXT primary key; MySQL's form is always VARCHAR(64).
    return [f for f in FORMS if f != "v18_34_doc" or VENDOR != "mysql"]


@pytest.mark.parametrize("form", forms())
def test_migrate_adopts_a_table_rust_created_and_keeps_every_row(rust_db, form):
    db = rust_db(form)
    now = int(time.time())
    db.execute(FORMS[form])
    db.execute(RUST_SCHEDULES)
    rows = [  # id, job_type, payload, status, attempts, max_retries, next_run_at, created_at, last_error
        ("r-due", "test.record", "from rust", "pending", 0, 3, now - 5, now - 5, None),
        ("r-later", "test.record", "later", "pending", 1, 3, now + 3600, now - 5, "boom"),
        ("r-running", "test.record", "held", "running", 0, 3, now - 5, now - 5, None),
        ("r-dead", "test.record", "gave up", "failed", 4, 3, now - 50, now - 90, "RuntimeError: no"),
    ]
    for row in rows:
        db.execute(SEED_INSERT_9, list(row))
    if form == "v18_36":
        db.execute(SEED_INSERT, ["r-urgent", "test.record", "urgent", 3, now - 1, now - 1, "mail", 7, "k-1"])
        # The same key again, later: the crate checks its keys itself, racily. The first keeps it.
        db.execute(SEED_INSERT, ["r-urgent-2", "test.record", "again", 3, now + 3600, now, "mail", 7, "k-1"])
    db.execute("INSERT INTO rws_job_schedules (name, next_run_at) VALUES (%s, %s)", ["nightly", now + 60])

    db.manage("migrate", "--run-syncdb", "-v0")  # (the test app has no migrations)

    got = {
        r[0]: r[1:]
        for r in db.execute(
            "SELECT id, job_type, payload, status, attempts, max_retries, next_run_at, created_at, "
            "last_error, "
            "queue, priority, unique_key, unique_hash, locked_by FROM rws_jobs"
        )
    }
    expected = {row[0]: (*row[1:], "default", 0, None, None, None) for row in rows}
    if form == "v18_36":
        expected["r-urgent"] = (
            "test.record",
            "urgent",
            "pending",
            0,
            3,
            now - 1,
            now - 1,
            None,
            "mail",
            7,
            "k-1",
            unique_hash("test.record", "k-1"),  # what our enqueue looks for
            None,
        )
        expected["r-urgent-2"] = (
            *("test.record", "again", "pending", 0, 3, now + 3600, now, None, "mail", 7, "k-1"),
            *(None, None),
        )
    assert got == expected
    schedules = db.execute("SELECT name, next_run_at, cron FROM rws_job_schedules")
    assert schedules == [("nightly", now + 60, None)]
    with db.conn.cursor() as c:
        constraints = db.conn.introspection.get_constraints(c, "rws_jobs")
    for name in ("rws_jobs_claim_idx", "rws_jobs_due_idx", "rws_jobs_queue_idx", "rws_jobs_unique_active"):
        assert name in constraints
    assert "rws_jobs_lease_idx" not in constraints
    # Ids, job types, queues and schedule names compare exactly (MariaDB: migration 0007).
    assert (
        db.execute(
            "SELECT id FROM rws_jobs WHERE id = 'R-DUE' OR job_type = 'Test.Record' "
            "OR queue IN ('DEFAULT', 'default ')"
        )
        == []
    )
    assert db.execute("SELECT name FROM rws_job_schedules WHERE name = 'NIGHTLY'") == []
    # Our columns are 64-bit wherever the model says so, whatever Rust created (INTEGER on PostgreSQL
    # is 32 bits): a job due after 2038 fits.
    db.execute("UPDATE rws_jobs SET next_run_at = %s WHERE id = 'r-later'", [2**40])
    # Text columns hold what the model's do (MariaDB's TEXT, 64 KiB, is widened to LONGTEXT).
    db.execute("UPDATE rws_jobs SET payload = %s WHERE id = 'r-later'", ["x" * 70_000])
    assert db.execute("SELECT LENGTH(payload) FROM rws_jobs WHERE id = 'r-later'") == [(70_000,)]
    db.execute("UPDATE rws_jobs SET payload = 'later' WHERE id = 'r-later'")
    # Nothing is left for the migrations to do, and the Rust crate's start-up still passes.
    assert "No changes detected" in db.manage("makemigrations", "django_rws_jobs", "--check", "--dry-run")
    db.execute(RUST_JOBS)
    for column, _ in RUST_UPGRADE:
        db.execute(f"SELECT {column} FROM rws_jobs WHERE 1 = 0")
    db.execute(RUST_SCHEDULES)

    # The adopted rows run on our worker: the due ones (highest priority first), not the future,
    # dead or Rust-held ones.
    worker = start_worker("--burst", "--workers", "1", env=db.env())
    out, _ = worker.communicate(timeout=120)
    assert worker.returncode == 0, out
    ran = [r[0] for r in db.execute("SELECT payload FROM testapp_run WHERE kind = 'record' ORDER BY id")]
    assert ran == (["urgent", "from rust"] if form == "v18_36" else ["from rust"])
    left = dict(db.execute("SELECT id, status FROM rws_jobs"))
    expected_left = {"r-later": "pending", "r-running": "running", "r-dead": "failed"}
    if form == "v18_36":
        expected_left["r-urgent-2"] = "pending"
    assert left == expected_left


def test_a_table_with_columns_we_do_not_know_is_not_adopted(rust_db):
    db = rust_db("alien")
    db.execute(
        "CREATE TABLE rws_jobs (id VARCHAR(64) PRIMARY KEY, job_type TEXT NOT NULL, "
        "payload TEXT NOT NULL, colour VARCHAR(10))"
    )
    db.execute("INSERT INTO rws_jobs (id, job_type, payload, colour) VALUES ('a', 'x', '', 'red')")
    done = subprocess.run(
        [sys.executable, "-m", "django", "migrate", "-v0"],
        cwd=ROOT,
        env=db.env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode != 0
    assert "cannot adopt table 'rws_jobs'" in done.stderr and "colour" in done.stderr
    assert db.execute("SELECT id, colour FROM rws_jobs") == [("a", "red")]
