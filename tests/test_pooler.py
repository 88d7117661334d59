"""Behind PgBouncer in transaction mode: the worker leaves no session state on the server
connections other clients get next, prepares nothing, and falls back to polling; and how many
server connections a worker holds. Each test starts its own PgBouncer in front of the test run's
PostgreSQL (Debian's package; scripts/test installs it)."""

import os
import time

import pytest
from django.db import connection

import django_rws_jobs as rws
from django_rws_jobs.models import Job
from tests import pgbouncer
from tests.test_worker import WorkerProcess, run_counts, wait_for
from tests.testapp.models import Run

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("RWS_TEST_DB", "sqlite") != "postgres", reason="PostgreSQL only"),
]

#: What the worker sets for its own statements' transactions (backends/postgresql.py prologue)
#: and for the admin's counts (time_limit): none may be seen by another client of the pooler.
SETTINGS = (
    "enable_seqscan",
    "enable_sort",
    "enable_incremental_sort",
    "jit",
    "synchronous_commit",
    "statement_timeout",
)


@pytest.fixture
def bouncer():
    if not pgbouncer.available():
        if os.environ.get("CI"):
            pytest.fail("pgbouncer is missing: scripts/test installs Debian's package")
        pytest.skip("pgbouncer is not installed (scripts/test installs it)")
    if os.environ.get("RWS_TEST_POOLER") == "pgbouncer":
        pytest.skip("the run itself goes through PgBouncer: these tests put their own in front of PostgreSQL")
    # A pool smaller than the clients: the workers' and the readers' transactions share few
    # server connections, so each reader's session has just served a worker's statement.
    b = pgbouncer.PgBouncer(pgbouncer.free_port(), int(connection.settings_dict["PORT"] or 5432), pool_size=3)
    yield b
    b.admin(f"KILL {connection.settings_dict['NAME']}")
    b.stop()


def pooled_worker(started, tmp_path, bouncer, *args, jobs=None, name="pooled"):
    """A worker that reaches PostgreSQL through ``bouncer``, told so as Django's docs say (killed
    at the test's end)."""
    env = {
        "PGPORT": str(bouncer.port),
        "RWS_TEST_DISABLE_SERVER_SIDE_CURSORS": "1",
        "RWS_TEST_DIRECT_PORT": str(connection.settings_dict["PORT"] or 5432),
    }
    w = WorkerProcess(tmp_path, *args, jobs=jobs or {}, name=name, env=env)
    started.append(w)
    return w


def session_values(port: int) -> tuple[str, ...]:
    """Each of SETTINGS as a new client connection to ``port`` sees it."""
    import psycopg

    with psycopg.connect(
        host="127.0.0.1",
        port=port,
        user=connection.settings_dict["USER"],
        dbname=connection.settings_dict["NAME"],
        autocommit=True,
        prepare_threshold=None,
    ) as conn:
        cur = psycopg.ClientCursor(conn)
        cur.execute("SELECT " + ", ".join(f"current_setting('{name}')" for name in SETTINGS))
        return cur.fetchone()


def test_nothing_a_worker_sets_reaches_the_other_clients_of_a_pooler(tmp_path, bouncer, started):
    direct = session_values(int(connection.settings_dict["PORT"] or 5432))
    rws.enqueue_many([{"job_type": "test.record", "payload": str(i)} for i in range(2000)])
    workers = [
        pooled_worker(started, tmp_path, bouncer, "--workers", "4", name=f"pooled-{i}") for i in range(2)
    ]
    for w in workers:
        w.started()
    seen = []
    deadline = time.monotonic() + 120
    while Job.objects.exists() and time.monotonic() < deadline:
        seen.append(session_values(bouncer.port))
    assert not Job.objects.exists(), [w.output() for w in workers]
    counts = run_counts()
    assert len(counts) == 2000 and set(counts.values()) == {1}  # nothing lost, nothing doubled
    assert len(seen) >= 20, len(seen)
    assert all(values == direct for values in seen), {v for v in seen if v != direct}
    for w in workers:
        assert "prepared statement" not in w.output(), w.output()
        assert "(transaction pooler: polling every" in w.output(), w.output()


def test_a_pooled_worker_polls_and_picks_up_within_its_poll_interval(tmp_path, bouncer, started):
    w = pooled_worker(started, tmp_path, bouncer, jobs={"POLL_INTERVAL": 0.5})
    w.started()
    assert "rws-listener" not in w.output()
    for i in range(5):
        time.sleep(0.7)  # idle: the worker sleeps between polls
        enqueued = time.time()
        rws.enqueue("test.record", f"p{i}")
        wait_for(lambda i=i: run_counts().get(f"p{i}") == 1, 10, f"job p{i} to run")
        ran = Run.objects.get(payload=f"p{i}").at.timestamp()
        # The documented bound is POLL_INTERVAL; the rest is the claim, the hand-off and the
        # handler's own write on a loaded machine.
        assert ran - enqueued < 0.5 + 0.7, (i, ran - enqueued)


def test_a_listen_database_wakes_a_pooled_worker_at_once(tmp_path, bouncer, started):
    # LISTEN_DATABASE names an alias that bypasses the pooler ("direct" in tests/settings.py).
    w = pooled_worker(started, tmp_path, bouncer, jobs={"POLL_INTERVAL": 30, "LISTEN_DATABASE": "direct"})
    w.started()
    assert "(LISTEN on 'direct')" in w.output(), w.output()
    time.sleep(1)
    rws.enqueue("test.record", "woken")
    wait_for(lambda: run_counts().get("woken") == 1, 5, "the LISTENing worker to wake")


def test_a_worker_holds_at_most_its_threads_plus_four_connections(tmp_path, started):
    threads = 3
    w = WorkerProcess(
        tmp_path,
        "--workers",
        str(threads),
        jobs={"POLL_INTERVAL": 0.2},
        env={"PGAPPNAME": "rws-counted"},
    )
    started.append(w)
    w.started()
    # A first wave connects the completer; the second holds every executor's Django connection
    # (each handler writes a trace, then sleeps) while the cancel watcher looks at its jobs.
    for i in range(threads):
        rws.enqueue("test.record", str(i))
    wait_for(lambda: len(run_counts()) == threads and not Job.objects.exists(), 20, "the first wave")
    for _ in range(threads):
        rws.enqueue("test.sleep", "3")
    wait_for(
        lambda: len(run_counts("start")) == 1 and run_counts("start")["3"] == threads, 20, "every thread busy"
    )
    counts = []
    queries = []
    for _ in range(15):
        with connection.cursor() as c:
            c.execute(
                "SELECT query FROM pg_stat_activity "
                "WHERE application_name = 'rws-counted' AND datname = current_database()"
            )
            held = [q for (q,) in c.fetchall()]
        counts.append(len(held))
        queries.append(held)
        time.sleep(0.1)
    most = max(counts)
    shown = "\n".join(q[-150:] for q in queries[counts.index(most)])
    # Executors, dispatcher, completer, the shared bookkeeping connection, the listener.
    assert threads + 2 < most <= threads + 4, shown


def test_a_count_with_a_time_limit_leaves_the_session_as_it_was():
    from django.db import transaction

    from django_rws_jobs.database.backends import backend_for

    def timeout():
        with connection.cursor() as c:
            c.execute("SHOW statement_timeout")
            return c.fetchone()[0]

    before = timeout()
    backend = backend_for(connection)
    assert backend.count_within(Job.objects.all(), 5) == 0
    assert timeout() == before
    with transaction.atomic():  # a caller's transaction (ATOMIC_REQUESTS): its value comes back
        with connection.cursor() as c:
            c.execute("SET LOCAL statement_timeout = '7s'")
        assert backend.count_within(Job.objects.all(), 5) == 0
        assert timeout() == "7s"
    assert timeout() == before


@pytest.mark.parametrize("conforming", ["on", "off"])
def test_bound_literals_mean_the_values_whatever_the_strings_setting(conforming):
    """What ScopedCursor writes into its simple queries reads back as the value it bound."""
    from django_rws_jobs.database.backends.postgresql import _pieces

    def bind(sql, params):
        from django_rws_jobs.database.backends.postgresql import bind

        return bind(_pieces(sql), params)

    values = ["plain", "it's", "back\\slash", "\\'", "ünïcode ✓", "%s", "%%", "", "a\nb", 0, -5, 2**62, None]
    values += [["a", "b'c", "d\\e"], ("x", "y")]
    with connection.cursor() as c:
        c.execute(f"SET standard_conforming_strings = {conforming}")
        for value in values:
            text = bind("SELECT %s, '100%%'", [value])
            c.execute(text)  # (no parameters: Django and psycopg send it as it is)
            got, percent = c.fetchone()
            assert percent == "100%"
            assert got == (list(value) if isinstance(value, tuple) else value), (value, text)
        c.execute("SET standard_conforming_strings = on")
    # What bind() leaves to psycopg, which refuses NUL and types the rest itself.
    assert bind("SELECT %s", ["a\x00b"]) is None
    assert bind("SELECT %s", [True]) is None
    assert bind("SELECT %s", [[]]) is None
    assert bind("SELECT %s, %s", [1]) is None
