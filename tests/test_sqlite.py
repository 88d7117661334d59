import json

import pytest
from django.db import connection, connections

from tests.conftest import run_python, subprocess_env

sqlite_only = pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite connection set-up")
pytestmark = pytest.mark.django_db(transaction=True)


def pragma(conn, name):
    with conn.cursor() as c:
        c.execute(f"PRAGMA {name}")
        return c.fetchone()[0]


@sqlite_only
def test_sqlite_connections_get_wal_busy_timeout_and_immediate_transactions():
    conn = connections.create_connection("default")
    try:
        conn.ensure_connection()
        assert pragma(conn, "journal_mode") == "wal"
        assert pragma(conn, "busy_timeout") == 30000
        assert pragma(conn, "synchronous") == 1  # NORMAL
        assert conn.transaction_mode == "IMMEDIATE"
    finally:
        conn.close()


@pytest.mark.parametrize("setting, set_up", [(None, False), (["other"], True)])
def test_other_sqlite_aliases_keep_their_settings(tmp_path, setting, set_up):
    """Only the queue's SQLite alias gets the set-up (WAL, synchronous=NORMAL, IMMEDIATE
    transactions, a busy timeout), and those RWS_JOBS["SQLITE_SETUP_ALIASES"] names. In a process
    whose settings add an alias "other" beside the queue's "default", whatever database that is."""
    env = subprocess_env(
        DJANGO_SETTINGS_MODULE="tests.settings_sqlite_aliases",
        RWS_TEST_OTHER_SQLITE=str(tmp_path / "other.sqlite3"),
    )
    if setting is not None:
        env["RWS_TEST_JOBS"] = json.dumps({"SQLITE_SETUP_ALIASES": setting})
    proc = run_python(
        "import json\n"
        "from django.db import connections\n"
        "other = connections['other']\n"
        "with other.cursor() as c:\n"
        "    seen = {p: c.execute(f'PRAGMA {p}').fetchone()[0]\n"
        "            for p in ('journal_mode', 'synchronous', 'busy_timeout')}\n"
        "print(json.dumps({**seen, 'transaction_mode': other.transaction_mode}))\n",
        env=env,
    )
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    seen = json.loads(out.strip().splitlines()[-1])
    if set_up:
        want = {
            "journal_mode": "wal",
            "synchronous": 1,
            "busy_timeout": 30000,
            "transaction_mode": "IMMEDIATE",
        }
    else:  # SQLite's and Django's defaults
        want = {"journal_mode": "delete", "synchronous": 2, "busy_timeout": 5000, "transaction_mode": None}
    assert seen == want


@sqlite_only
def test_the_users_choices_are_kept():
    from django.db.backends.sqlite3.base import DatabaseWrapper

    settings_dict = {**connection.settings_dict, "OPTIONS": {"timeout": 2, "transaction_mode": "DEFERRED"}}
    conn = DatabaseWrapper(settings_dict, alias="default")
    try:
        conn.ensure_connection()
        assert pragma(conn, "busy_timeout") == 2000
        assert conn.transaction_mode == "DEFERRED"
    finally:
        conn.close()


@sqlite_only
def test_the_workers_own_connections_to_one_file_take_turns_writing():
    """A claim waits on the process's lock while another of the worker's connections writes,
    instead of meeting it in SQLite's busy handler (which sleeps 1 ms and more)."""
    import threading
    import time

    from django_rws_jobs import enqueue
    from django_rws_jobs.database.connections import private_connection
    from django_rws_jobs.queue.store import Store

    enqueue("test.noop")
    a, b = Store(private_connection("default")), Store(private_connection("default"))
    b.conn.inc_thread_sharing()  # the claim runs in another thread
    assert a.writes is b.writes
    assert Store(connection).writes is not a.writes  # not the caller's own connection (tick())
    got = []
    now = int(time.time())
    try:
        with a.writes:
            claimer = threading.Thread(target=lambda: got.extend(b.claim("t#1", now, now + 60, None, 1)))
            claimer.start()
            claimer.join(0.3)
            assert claimer.is_alive() and got == []  # waiting for its turn
        claimer.join(10)
        assert [job.job_type for job in got] == ["test.noop"]
    finally:
        b.conn.dec_thread_sharing()
        a.conn.close()
        b.conn.close()


@sqlite_only
def test_checks_pass_at_once_while_another_connection_holds_the_write_lock():
    # Django's JSONField check asks the database inside transaction.atomic(); with the IMMEDIATE
    # transactions set up here that BEGIN waited for the write lock, the busy timeout (30 s), and
    # then reported "SQLite does not support JSONFields" (fields.E180): a worker or runserver
    # starting beside a long write transaction refused to start.
    import subprocess
    import sys
    import time

    from tests.conftest import ROOT

    writer = connections.create_connection("default")
    try:
        writer.ensure_connection()
        with writer.cursor() as c:
            c.execute("BEGIN IMMEDIATE")
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "django", "check"],
            cwd=ROOT,
            env=subprocess_env(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        took = time.monotonic() - started
    finally:
        with writer.cursor() as c:
            c.execute("ROLLBACK")
        writer.close()
    assert proc.returncode == 0, proc.stderr
    assert "E180" not in proc.stderr
    assert took < 15
