"""What holds back the cleanup of the queue's table (BaseBackend.horizon): a real transaction held
open on a second connection (PostgreSQL, MariaDB), a real -wal file grown behind a reader
(SQLite), seen by rws_health and the metrics endpoint."""

import re
import time
from contextlib import contextmanager

import pytest
from django.db import connection, connections
from prometheus_client import parser

import django_rws_jobs as rws
from django_rws_jobs.database.backends import backend_for
from django_rws_jobs.models import Job
from tests.test_health import health

pytestmark = pytest.mark.django_db(transaction=True)
vendor = connection.vendor
TOKEN = "s3cret-token-for-horizon"


@contextmanager
def snapshot_held():
    """Another connection's transaction with a snapshot taken (REPEATABLE READ, as a report
    runs), open while the block runs; yields that session's id."""
    other = connections.create_connection(connection.alias)
    try:
        with other.cursor() as c:
            if vendor == "postgresql":
                c.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                c.execute("SELECT COUNT(*) FROM rws_jobs")
                c.execute("SELECT pg_backend_pid()")
            elif vendor == "mysql":
                # Django's connections use READ COMMITTED, whose read view lasts one statement.
                c.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                c.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
                c.execute("SELECT COUNT(*) FROM rws_jobs")
                c.execute("SELECT CONNECTION_ID()")
            else:
                c.execute("BEGIN")
                c.execute("SELECT COUNT(*) FROM rws_jobs")
                c.execute("SELECT 0")
            pid = c.fetchone()[0]
        yield pid
    finally:
        with other.cursor() as c:
            c.execute("ROLLBACK")
        other.close()


def horizon():
    return backend_for(connection).horizon()


def churn(n):
    """``n`` jobs enqueued and deleted, each delete its own transaction: n dead row versions (and
    n undo logs on InnoDB)."""
    ids = rws.enqueue_many([("test.record", str(i)) for i in range(n)])
    for job_id in ids:
        Job.objects.filter(id=job_id).delete()


def scrape(client, settings):
    settings.RWS_JOBS = {**settings.RWS_JOBS, "METRICS_TOKEN": TOKEN}
    response = client.get("/rws/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200, response.content
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in parser.text_string_to_metric_families(response.content.decode())
        for s in family.samples
    }


@pytest.mark.skipif(vendor == "sqlite", reason="SQLite has no snapshot age: its measure is the WAL")
def test_a_snapshot_held_open_is_seen_with_its_holder(client, settings):
    assert horizon().snapshot_age < 1
    assert health("--max-snapshot-age", "1")[0] == 0
    with snapshot_held() as pid:
        time.sleep(1.5)
        found = horizon()
        assert found.snapshot_age >= 1.4 and found.holder.pid == pid
        code, line = health("--max-snapshot-age", "1")
        assert code == 1
        assert re.search(rf"has been open [12]s \(held by pid {pid}, user '", line), line
        assert "over --max-snapshot-age 1: see docs/howto/databases.md" in line
        assert health("--max-snapshot-age", "60")[0] == 0
        metrics = scrape(client, settings)
        assert metrics[("rws_db_oldest_snapshot_age_seconds", ())] >= 1.4
        (holder,) = [labels for name, labels in metrics if name == "rws_db_oldest_snapshot_holder"]
        assert ("pid", str(pid)) in holder
    # A closed session's transaction may linger a moment on the server (MariaDB ends it after the
    # client has gone).
    deadline = time.monotonic() + 5
    while horizon().snapshot_age >= 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert horizon().snapshot_age < 1, horizon()
    assert health("--max-snapshot-age", "1")[0] == 0


@pytest.mark.skipif(vendor != "mysql", reason="InnoDB's read views")
def test_a_read_committed_transaction_between_statements_holds_nothing_back():
    """Under READ COMMITTED (Django's default on MySQL) a transaction's read view lasts one
    statement: idle between two, it does not keep purge back, and is not reported."""
    other = connections.create_connection(connection.alias)
    try:
        with other.cursor() as c:
            c.execute("START TRANSACTION")
            c.execute("SELECT COUNT(*) FROM rws_jobs")
        time.sleep(1.5)
        assert horizon().snapshot_age < 1
    finally:
        with other.cursor() as c:
            c.execute("ROLLBACK")
        other.close()


@pytest.mark.skipif(vendor != "postgresql", reason="n_dead_tup is PostgreSQL's")
def test_dead_rows_a_snapshot_keeps_from_vacuum_are_counted(client, settings):
    def dead_after_vacuum():
        with connection.cursor() as c:
            c.execute("VACUUM rws_jobs")
        # The statistics reach pg_stat_user_tables within a second of VACUUM's end.
        deadline = time.monotonic() + 10
        while True:
            with connection.cursor() as c:
                c.execute("SELECT pg_stat_clear_snapshot()")
            dead = horizon().dead_rows
            if dead is not None and (dead < 200 or time.monotonic() > deadline):
                return dead
            time.sleep(0.2)

    with snapshot_held():
        churn(300)
        # VACUUM may not remove what the open snapshot may still see.
        dead = dead_after_vacuum()
        assert dead >= 300
        code, line = health("--max-dead-rows", "100")
        assert (
            code == 1
            and f"{dead} dead row version(s) of rws_jobs not vacuumed, over --max-dead-rows 100" in line
        )
        assert scrape(client, settings)[("rws_db_dead_rows", ())] >= 300
    assert dead_after_vacuum() < 200
    assert health("--max-dead-rows", "200")[0] == 0


@pytest.mark.skipif(vendor != "mysql", reason="the history list length is InnoDB's")
def test_undo_logs_a_snapshot_keeps_from_purge_are_counted(client, settings):
    with snapshot_held():
        churn(200)
        # Purge may not pass the open read view: the server's count holds at least these 200, once
        # it has counted them (InnoDB refreshes the metric in the background, about each second).
        deadline = time.monotonic() + 10
        while horizon().undo_history < 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert horizon().undo_history >= 200
        code, line = health("--max-dead-rows", "150")
        assert code == 1 and "undo log(s) not purged (history list length), over --max-dead-rows 150" in line
        assert scrape(client, settings)[("rws_db_undo_history_length", ())] >= 200


@pytest.mark.skipif(vendor != "sqlite", reason="the -wal file is SQLite's")
def test_the_wal_a_reader_keeps_from_restarting_grows_and_is_seen(client, settings):
    with connection.cursor() as c:
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert horizon().wal_bytes == 0
    with snapshot_held():
        for _ in range(5):
            rws.enqueue_many([("test.record", "x" * 2000) for _ in range(1000)])
        size = horizon().wal_bytes
        # Past the 1000 pages (4 MB) at which SQLite checkpoints and starts the file over.
        assert size > 8_000_000
        code, line = health("--max-wal-bytes", "4000000")
        assert code == 1 and line == (
            f"unhealthy: the -wal file is {size} bytes, over --max-wal-bytes 4000000: "
            "see docs/howto/databases.md"
        )
        assert scrape(client, settings)[("rws_db_wal_bytes", ())] >= size
    with connection.cursor() as c:
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert horizon().wal_bytes == 0
    assert health("--max-wal-bytes", "4000000")[0] == 0


def test_a_limit_the_database_does_not_measure_is_said_so():
    unmeasured = {
        "postgresql": {"--max-wal-bytes": "the WAL file's size is not measured on postgresql"},
        "mysql": {"--max-wal-bytes": "the WAL file's size is not measured on mysql"},
        "sqlite": {
            "--max-snapshot-age": "the oldest snapshot's age is not measured on sqlite",
            "--max-dead-rows": "dead rows are not measured on sqlite",
        },
    }[vendor]
    for flag, text in unmeasured.items():
        assert health(flag, "0") == (0, f"healthy: database 'default' answers; migrations applied; {text}")
