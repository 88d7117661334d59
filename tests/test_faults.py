"""Faults: handlers that cannot run as written, outcomes a database refuses, receivers that raise,
database errors that retrying cannot fix. No job is deleted unrun; no bad outcome stalls a worker."""

import json
import os
import subprocess
import sys
import time

import pytest
from django.db import DatabaseError, connection

import django_rws_jobs as rws
from django_rws_jobs.database.connections import is_transient, private_connection
from django_rws_jobs.models import Job
from tests.conftest import ROOT, subprocess_env
from tests.testapp.jobs import UNSTORABLE

pytestmark = pytest.mark.django_db(transaction=True)
VENDOR = os.environ.get("RWS_TEST_DB", "sqlite")


def burst(*args: str, name: str | None = None, jobs: dict | None = None, timeout: float = 60):
    """Run ``rws_worker --burst`` to its end; return (exit code, output)."""
    extra = {"RWS_TEST_JOBS": json.dumps(jobs or {})}
    if name is not None:
        extra["RWS_TEST_DB_NAME"] = name
    proc = subprocess.run(
        [sys.executable, "-m", "django", "rws_worker", "--burst", *args],
        cwd=ROOT,
        env=subprocess_env(**extra),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_async_handlers_run_and_generators_fail(runs):
    ran = rws.enqueue("test.async_record", "a1")
    gen = rws.enqueue("test.generator", "g1", max_retries=0)
    coro = rws.enqueue("test.returns_coroutine", "c1", max_retries=0)
    while rws.tick():
        pass
    assert runs() == [("async", "a1")]
    assert not Job.objects.filter(id=ran).exists()
    failed = {j.id: j.last_error for j in Job.objects.filter(status="failed")}
    assert set(failed) == {gen, coro}
    assert failed[gen].startswith("TypeError: the handler generator returned generator ")
    assert failed[coro].startswith("TypeError: the handler returns_coroutine returned coroutine async_record")


@pytest.mark.slow
def test_a_worker_runs_async_handlers_on_its_executor_threads(runs):
    for i in range(4):
        rws.enqueue("test.async_record", str(i))
    gen = rws.enqueue("test.generator", "g", max_retries=0)
    code, out = burst("--workers", "2")
    assert code == 0, out
    assert sorted(p for _, p in runs()) == ["0", "1", "2", "3"]
    assert list(Job.objects.values_list("id", "status")) == [(gen, "failed")]


def expected_error(kind: str) -> str:
    if kind == "surrogate":
        return "FileNotFoundError: cannot open \\udcff.txt"
    if kind == "nul":
        return "FileNotFoundError: cannot open a\\x00b"
    keep = 16_000 - len("\n[... 0000000 characters cut ...]\n")
    cut = f"\n[... {1_000_031 - keep} characters cut ...]\n"
    return "FileNotFoundError: cannot open " + "x" * (keep - 31) + cut


@pytest.mark.parametrize("kind", sorted(UNSTORABLE))
def test_an_error_text_no_database_can_store_is_recorded(kind):
    retried = rws.enqueue("test.unstorable_error", kind, max_retries=1)
    dead = rws.enqueue("test.unstorable_error", kind, max_retries=0)
    assert rws.tick() and rws.tick()
    rows = {j.id: j for j in Job.objects.all()}
    assert rows[retried].status == "pending" and rows[dead].status == "failed"
    for job in rows.values():
        assert job.last_error == expected_error(kind)
        assert len(job.last_error) <= 16_000 and len(job.traceback) <= 64_000
        if kind == "huge":
            assert "characters cut ...]" in job.traceback and job.traceback.endswith("xxx\n")
        else:
            assert job.traceback.endswith(expected_error(kind) + "\n")


@pytest.mark.slow
def test_unstorable_errors_do_not_stall_the_completer(runs):
    dead = [rws.enqueue("test.unstorable_error", kind, max_retries=0) for kind in sorted(UNSTORABLE)]
    for i in range(5):
        rws.enqueue("test.record", str(i))
    t0 = time.monotonic()
    code, out = burst("--workers", "2")
    assert code == 0, out
    assert time.monotonic() - t0 < 30, out  # not a lease's wait for a stuck outcome
    assert "died" not in out and "worker lost" not in out, out
    assert sorted(p for _, p in runs()) == ["0", "1", "2", "3", "4"]
    stored = dict(Job.objects.values_list("id", "last_error"))
    kinds = zip(dead, sorted(UNSTORABLE), strict=True)
    assert stored == {job_id: expected_error(kind) for job_id, kind in kinds}


# A check that refuses any non-ASCII last_error: stands for a value one database will not store.
#: Ways a database refuses a non-ASCII last_error, by vendor: (set up, undo).
REFUSALS = {
    "sqlite": {
        "trigger": (
            "CREATE TRIGGER rws_test_refuse BEFORE UPDATE OF last_error ON rws_jobs "
            "WHEN NEW.last_error GLOB '*[^ -~]*' BEGIN SELECT RAISE(ABORT, 'refused'); END",
            "DROP TRIGGER rws_test_refuse",
        )
    },
    "postgres": {
        "check": (
            "ALTER TABLE rws_jobs ADD CONSTRAINT rws_test_refuse "
            "CHECK (last_error IS NULL OR last_error ~ '^[ -~]*$')",
            "ALTER TABLE rws_jobs DROP CONSTRAINT rws_test_refuse",
        )
    },
    "mysql": {
        # A CHECK constraint (error 4025, IntegrityError in Django)...
        "check": (
            "ALTER TABLE rws_jobs ADD CONSTRAINT rws_test_refuse "
            "CHECK (last_error IS NULL OR last_error REGEXP '^[ -~]*$')",
            "ALTER TABLE rws_jobs DROP CONSTRAINT rws_test_refuse",
        ),
        # ...a column whose character set cannot hold the text (1366) and a trigger's SIGNAL
        # (1644), which mysqlclient raises as OperationalError, as it does a lost connection.
        "charset": (
            "ALTER TABLE rws_jobs MODIFY last_error longtext CHARACTER SET ascii DEFAULT NULL",
            "ALTER TABLE rws_jobs MODIFY last_error longtext DEFAULT NULL",
        ),
        "signal": (
            "CREATE TRIGGER rws_test_refuse BEFORE UPDATE ON rws_jobs FOR EACH ROW "
            "IF NEW.last_error REGEXP '[^ -~]' THEN "
            "SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'refused'; END IF",
            "DROP TRIGGER rws_test_refuse",
        ),
    },
}


@pytest.fixture(params=["trigger", "check", "charset", "signal"])
def refuse_non_ascii_errors(request):
    if request.param not in REFUSALS[VENDOR]:
        pytest.skip(f"no {request.param} refusal on {VENDOR}")
    set_up, undo = REFUSALS[VENDOR][request.param]
    with connection.cursor() as c:
        c.execute(set_up)
    yield
    with connection.cursor() as c:
        c.execute(undo)


@pytest.mark.slow
def test_an_outcome_the_database_refuses_is_recorded_plainly(refuse_non_ascii_errors, runs):
    dead = rws.enqueue("test.fail", "ünïcode", max_retries=0)
    retried = rws.enqueue("test.fail", "ü", max_retries=3)
    for i in range(3):
        rws.enqueue("test.record", str(i))
    t0 = time.monotonic()
    code, out = burst("--workers", "2", jobs={"BACKOFF_INITIAL": 3600})
    assert code == 0, out
    assert time.monotonic() - t0 < 30, out
    assert sorted(p for _, p in runs()) == ["0", "1", "2"]
    rows = {j.id: j for j in Job.objects.all()}
    assert (rows[dead].status, rows[dead].last_error, rows[dead].traceback) == (
        "failed",
        "ValueError: boom \\xfcn\\xefcode",
        None,
    )
    assert (rows[retried].status, rows[retried].attempts, rows[retried].last_error) == (
        "pending",
        1,
        "ValueError: boom \\xfc",
    )
    # tick() takes the same way.
    other = rws.enqueue("test.fail", "ß", max_retries=0)
    assert rws.tick()
    assert Job.objects.get(id=other).last_error == "ValueError: boom \\xdf"


@pytest.mark.slow
def test_a_job_dead_receiver_cannot_stop_the_worker(runs):
    dead = rws.enqueue("test.fail", "exit-in-receiver", max_retries=0)
    for i in range(6):
        rws.enqueue("test.slow_record", str(i))
    code, out = burst("--workers", "2")
    assert code == 0, out
    assert "died" not in out, out
    assert "SystemExit: 4" in out  # logged with the receiver's name
    assert runs("receiver1") == [("receiver1", dead)] and runs("receiver2") == [("receiver2", dead)]
    assert sorted(p for _, p in runs("record")) == [str(i) for i in range(6)]
    assert list(Job.objects.values_list("id", "status")) == [(dead, "failed")]


def test_a_job_dead_receiver_cannot_stop_tick(runs):
    dead = rws.enqueue("test.fail", "exit-in-receiver", max_retries=0)
    assert rws.tick() is True
    assert runs("receiver2") == [("receiver2", dead)]


def empty_database(tmp_path) -> str:
    """A database of the test server's kind without django-rws-jobs's tables; dropped after the test."""
    if VENDOR == "sqlite":
        return str(tmp_path / "empty.sqlite3")
    name = f"test_rws_empty_{os.getpid()}"
    with connection.cursor() as c:
        c.execute(f"DROP DATABASE IF EXISTS {name}")
        c.execute(f"CREATE DATABASE {name}")
    return name


@pytest.mark.slow
def test_a_worker_without_its_tables_fails_fast(tmp_path):
    name = empty_database(tmp_path)
    try:
        t0 = time.monotonic()
        code, out = burst(name=name, timeout=60)
        assert code == 1, out
        assert time.monotonic() - t0 < 15, out
        assert "retrying cannot fix" in out and "rws_jobs" in out and "manage.py migrate" in out, out
        assert "retrying in" not in out, out
    finally:
        if VENDOR != "sqlite":
            with connection.cursor() as c:
                c.execute(f"DROP DATABASE IF EXISTS {name}")


def database_error(sql: str, conn=None) -> DatabaseError:
    conn = conn or connection
    with pytest.raises(DatabaseError) as info:
        with conn.cursor() as c:
            c.execute(sql)
    return info.value


def test_error_kinds():
    assert not is_transient(database_error("SELECT * FROM rws_no_such_table"))
    assert not is_transient(database_error("SELECT no_such_column FROM rws_jobs"))
    assert not is_transient(database_error("SELEKT 1"))
    # A lock that another connection holds past this one's lock timeout passes by itself.
    rws.enqueue("test.record", "locked")
    holder, waiter = private_connection("default"), private_connection("default")
    try:
        if VENDOR == "sqlite":
            holder.cursor().execute("BEGIN IMMEDIATE")
            waiter.cursor().execute("PRAGMA busy_timeout = 10")
            lock_sql = "UPDATE rws_jobs SET attempts = 1"
        else:
            holder.cursor().execute("BEGIN")
            holder.cursor().execute("SELECT id FROM rws_jobs FOR UPDATE")
            waiter.cursor().execute(
                "SET lock_timeout = '50ms'"
                if VENDOR == "postgres"
                else "SET SESSION innodb_lock_wait_timeout = 1"
            )
            lock_sql = "UPDATE rws_jobs SET attempts = 1"
        assert is_transient(database_error(lock_sql, waiter))
    finally:
        holder.close()
        waiter.close()


def test_tick_records_a_system_exit_then_raises():
    """tick() runs a handler in the caller's thread: a SystemExit (or a Ctrl-C) from it is the
    job's failure, recorded before it goes on up, not a job left running until its lease ends."""
    job_id = rws.enqueue("test.system_exit", "x", max_retries=1)
    with pytest.raises(SystemExit):
        rws.tick()
    job = Job.objects.get(id=job_id)
    assert (job.status, job.attempts, job.last_error) == ("pending", 1, "SystemExit: 3")
    assert job.locked_by is None and "raise SystemExit(3)" in job.traceback


@pytest.mark.skipif(VENDOR != "sqlite", reason="PostgreSQL and MariaDB refuse text that is not UTF-8")
def test_a_row_that_is_not_utf8_does_not_strand_the_others_on_sqlite(runs):
    """Another program may write bytes that are not UTF-8 into a TEXT column of SQLite. The
    worker's claim used to fail on reading such a row after it had taken the rows with it, which
    then stayed running; recovery failed on them the same way, at every start."""
    now = int(time.time())
    good = [rws.enqueue("test.record", str(i)) for i in range(4)]
    with connection.cursor() as c:
        for job_id, job_type, payload in [
            ("bad-payload", "'test.fail'", "CAST(x'ff41' AS TEXT)"),
            ("bad-type", "CAST(x'ff43' AS TEXT)", "''"),
        ]:
            c.execute(
                "INSERT INTO rws_jobs (id, job_type, payload, next_run_at, created_at, max_retries) "
                f"VALUES ('{job_id}', {job_type}, {payload}, {now}, {now}, 0)"
            )
    code, out = burst("--workers", "4")
    assert code == 0, out
    assert sorted(p for _, p in runs()) == ["0", "1", "2", "3"]
    assert not Job.objects.filter(id__in=good).exists()
    with connection.cursor() as c:
        c.execute("SELECT id, status, attempts, last_error FROM rws_jobs ORDER BY id")
        assert c.fetchall() == [
            ("bad-payload", "failed", 1, "ValueError: boom \\udcffA"),
            ("bad-type", "failed", 1, "no handler registered for job_type '\\udcffC'"),
        ]
