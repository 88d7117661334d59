"""Enqueueing once per burst (api/enqueue_once.py): ``on_conflict="replace"`` and its
``max_delay`` (a debounce that always fires), ``unique_for`` (a throttle), and what each call
says it did. In this process first; then many processes enqueueing at once, and real workers."""

import json
import time
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection, connections

import django_rws_jobs as rws
from django_rws_jobs.api.enqueue_once import prune_windows
from django_rws_jobs.database import clock
from django_rws_jobs.models import Job, UniqueWindow
from django_rws_jobs.queue.store import Store
from django_rws_jobs.queue.unique_keys import unique_hash
from django_rws_jobs.workflows.dependency_outcomes import sweep
from tests.conftest import drain, run_python, short_lock_waits
from tests.test_worker import wait_for, workers  # noqa: F401  (a fixture)
from tests.testapp.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


def rows(key: str) -> list[tuple]:
    return list(
        Job.objects.filter(unique_key=key).order_by("created_at", "id").values_list("status", "payload")
    )


# -- replace -----------------------------------------------------------------------------------


def test_a_replace_updates_the_waiting_holder_and_returns_its_id():
    first = rws.enqueue("test.record", "v1", unique="k", on_conflict="replace", run_in=600, priority=1)
    assert first.outcome == "stored"
    second = rws.enqueue(
        "test.record", "v2", unique="k", on_conflict="replace", run_in=30, priority=5, metadata={"n": 2}
    )
    assert (second, second.outcome) == (first, "replaced")
    job = Job.objects.get(id=first)
    assert (job.payload, job.priority, job.metadata) == ("v2", 5, {"n": 2})
    assert job.next_run_at <= clock.now() + 31  # the new due time, not the first's
    assert rows("k") == [("pending", "v2")]


def test_skip_stays_the_default_and_says_so():
    first = rws.enqueue("test.record", "v1", unique="s")
    second = rws.enqueue("test.record", "v2", unique="s")
    assert (first.outcome, second, second.outcome) == ("stored", first, "skipped")
    assert isinstance(second, str) and rows("s") == [("pending", "v1")]


def claim_one(store: Store, expected: str):
    (claimed,) = store.claim("w#1", int(clock.now()), int(clock.now()) + 60, None, 1)
    assert claimed.id == expected
    return claimed


def holder_of(key: str, job_type: str = "test.record") -> tuple:
    with connection.cursor() as c:
        c.execute("SELECT id, status FROM rws_jobs WHERE unique_hash = %s", [unique_hash(job_type, key)])
        return c.fetchone()


def test_a_running_holder_is_never_changed_and_a_successor_waits_for_it():
    holder = rws.enqueue("test.record", "running", unique="r", on_conflict="replace")
    store = Store(connection)
    claimed = claim_one(store, holder)
    fields = [f.attname for f in Job._meta.concrete_fields if f.attname != "has_dependents"]
    before = Job.objects.filter(id=holder).values(*fields).get()
    successor = rws.enqueue("test.record", "next", unique="r", on_conflict="replace", priority=3)
    assert successor != holder and successor.outcome == "stored"
    again = rws.enqueue("test.record", "newer", unique="r", on_conflict="replace")
    assert (again, again.outcome) == (successor, "replaced")  # one successor per key
    # Its row unchanged but for the flag that tells its worker to resolve what waits for it,
    # as for any enqueue(after=[a running job]).
    assert Job.objects.filter(id=holder).values(*fields).get() == before
    assert rows("r") == [("running", "running"), ("blocked", "newer")]
    skipped = rws.enqueue("test.record", "skip", unique="r")
    assert (skipped, skipped.outcome) == (holder, "skipped")  # the running holder keeps the key
    assert store.complete(claimed)  # its worker's outcome still applies
    sweep(store, int(clock.now()))  # (a worker resolves what waits at once: test_successors_*)
    assert rows("r") == [("pending", "newer")]
    assert holder_of("r") == (successor, "pending")  # released, it holds the key's own hash
    with connection.cursor() as c:  # and rust-web-server's own check sees it
        c.execute(
            "SELECT id FROM rws_jobs WHERE job_type = %s AND unique_key = %s "
            "AND status IN ('pending', 'running')",
            ["test.record", "r"],
        )
        assert [row[0] for row in c.fetchall()] == [successor]
    latest = rws.enqueue("test.record", "latest", unique="r", on_conflict="replace")
    assert (latest, latest.outcome) == (successor, "replaced")


def test_a_replace_is_one_statement_where_the_database_returns_the_row():
    from django.test.utils import CaptureQueriesContext

    from django_rws_jobs.database.backends import backend_for

    first = rws.enqueue("test.record", "1", unique="one", on_conflict="replace", run_in=60)
    with CaptureQueriesContext(connection) as queries:
        again = rws.enqueue("test.record", "2", unique="one", on_conflict="replace", run_in=60)
    assert (again, again.outcome) == (first, "replaced")
    statements = [q["sql"] for q in queries.captured_queries]
    # (MySQL's: the statement and a read back, in a transaction)
    assert len(statements) == (1 if backend_for(connection).replace_returns else 2), statements


@pytest.mark.skipif(connection.vendor != "mysql", reason="MySQL's statement, without RETURNING")
def test_a_replace_without_returning_reads_the_row_back(monkeypatch):
    """MySQL has no RETURNING: the replace reads the row back under the lock its statement took
    (MariaDB's own path returns it; this runs MySQL's on MariaDB)."""
    from django_rws_jobs.database.backends import backend_for
    from django_rws_jobs.database.backends.mysql import MySQLBackend

    monkeypatch.setattr(MySQLBackend, "replace_returns", False)
    connections["default"].rws_backend = None  # a new backend makes the statement's text again
    try:
        first = rws.enqueue("test.record", "1", unique="m", on_conflict="replace", run_in=60)
        second = rws.enqueue("test.record", "2", unique="m", on_conflict="replace")
        assert (first.outcome, second, second.outcome) == ("stored", first, "replaced")
        assert "RETURNING" not in backend_for(connections["default"]).replace_job_sql
        claim_one(Store(connection), first)
        successor = rws.enqueue("test.record", "3", unique="m", on_conflict="replace")
        assert successor.outcome == "stored" and rows("m") == [("running", "2"), ("blocked", "3")]
    finally:
        connections["default"].rws_backend = None  # and with RETURNING again for the next tests


@pytest.mark.skipif(
    connection.vendor == "sqlite",
    reason="SQLite has one writer: an open write transaction blocks every other",
)
def test_a_replace_in_an_open_transaction_does_not_hold_a_running_holders_worker():
    """A caller's transaction that replaced beside a running holder stays open: the holder's
    worker still renews its lease and finishes it (its row is not locked), and the successor is
    released once the caller commits."""
    from django.db import transaction

    from django_rws_jobs.database.connections import private_connection

    holder = rws.enqueue("test.record", "1", unique="open", on_conflict="replace")
    worker = private_connection("default")
    try:
        store = Store(worker)
        short_lock_waits(store)
        claimed = claim_one(store, holder)
        with transaction.atomic():
            successor = rws.enqueue("test.record", "2", unique="open", on_conflict="replace")
            again = rws.enqueue("test.record", "3", unique="open", on_conflict="replace")
            assert successor.outcome == "stored" and (again, again.outcome) == (successor, "replaced")
            assert store.renew([claimed.token], int(clock.now()) + 120) == 1  # no lock wait
            assert store.complete(claimed)
        assert holder_of("open") == (successor, "pending")  # the enqueue's recheck released it
        assert rows("open") == [("pending", "3")]
    finally:
        worker.close()


def test_a_successor_runs_after_a_holder_that_failed():
    holder = rws.enqueue("test.fail", "x", unique="f", on_conflict="replace", max_retries=0)
    store = Store(connection)
    claimed = claim_one(store, holder)
    successor = rws.enqueue("test.fail", "y", unique="f", on_conflict="replace")
    assert successor.outcome == "stored"
    assert store.move_to_dead_letters(claimed, 1, "boom", None, int(clock.now()))
    sweep(store, int(clock.now()))
    assert holder_of("f", "test.fail") == (successor, "pending")


def test_a_successor_whose_key_was_taken_meanwhile_gives_way():
    """The holder ended, and before anything released its successor an enqueue found the key
    free: a waiting taker is the newer, and the successor is cancelled, saying so; a running
    taker becomes what the successor waits for."""
    store = Store(connection)
    for key, taker_runs in (("w", False), ("t", True)):
        holder = rws.enqueue("test.record", "1", unique=key, on_conflict="replace")
        claimed = claim_one(store, holder)
        successor = rws.enqueue("test.record", "2", unique=key, on_conflict="replace")
        assert store.complete(claimed)  # and nothing resolved its successor yet
        taker = rws.enqueue("test.record", "3", unique=key, on_conflict="replace")
        assert taker.outcome == "stored" and taker != successor
        if taker_runs:
            taken = claim_one(store, taker)
        sweep(store, int(clock.now()))
        job = Job.objects.get(id=successor)
        if not taker_runs:
            assert (job.status, job.unique_hash) == ("cancelled", None)
            assert "newer job with its unique key" in job.last_error
            assert holder_of(key) == (taker, "pending")
            Job.objects.filter(id=taker).delete()
            continue
        assert job.status == "blocked"  # it waits for the taker now
        assert holder_of(key) == (taker, "running")
        assert store.complete(taken)
        sweep(store, int(clock.now()))
        assert holder_of(key) == (successor, "pending")


def test_max_delay_caps_the_due_time_however_often_it_is_replaced():
    first = rws.enqueue("test.record", "a", unique="d", on_conflict="replace", run_in=60, max_delay=100)
    job = Job.objects.get(id=first)
    assert job.due_by == job.created_at + 100
    # The burst began 95 s ago: a replace asking for 60 s more is due at its cap instead.
    Job.objects.filter(id=first).update(created_at=job.created_at - 95, due_by=job.due_by - 95)
    again = rws.enqueue("test.record", "b", unique="d", on_conflict="replace", run_in=60, max_delay=100)
    job = Job.objects.get(id=first)
    assert (again.outcome, job.next_run_at, job.payload) == ("replaced", job.due_by, "b")
    # A replace without max_delay keeps the burst's cap.
    rws.enqueue("test.record", "c", unique="d", on_conflict="replace", run_in=3600)
    assert Job.objects.get(id=first).next_run_at == job.due_by


def test_a_holder_stored_without_max_delay_is_capped_from_its_enqueue():
    first = rws.enqueue("test.record", "a", unique="e", run_in=600)
    Job.objects.filter(id=first).update(created_at=int(clock.now()) - 50)
    rws.enqueue("test.record", "b", unique="e", on_conflict="replace", run_in=600, max_delay=60)
    job = Job.objects.get(id=first)
    assert job.next_run_at == job.created_at + 60 == job.due_by


def test_the_next_enqueue_after_the_job_ran_starts_a_new_burst():
    first = rws.enqueue("test.record", "a", unique="n", on_conflict="replace", max_delay=10)
    drain()
    second = rws.enqueue("test.record", "b", unique="n", on_conflict="replace", run_in=60, max_delay=100)
    assert (second.outcome, second != first) == ("stored", True)
    job = Job.objects.get(id=second)
    assert job.due_by == job.created_at + 100


# -- throttle ----------------------------------------------------------------------------------


def test_a_throttle_keeps_the_key_taken_after_the_job_succeeded():
    first = rws.enqueue("test.record", "1", unique="t", unique_for=60)
    assert first.outcome == "stored"
    assert drain() == 1  # succeeded: its row is gone
    second = rws.enqueue("test.record", "2", unique="t", unique_for=timedelta(minutes=1))
    assert (second, second.outcome) == (first, "skipped")  # the id of the job that took the window
    assert not Job.objects.exists()
    UniqueWindow.objects.update(until=int(clock.now()) - 1)  # the window has passed
    third = rws.enqueue("test.record", "3", unique="t", unique_for=60)
    assert (third.outcome, third != first) == ("stored", True)
    assert UniqueWindow.objects.get().job_id == third


def test_passed_windows_are_pruned():
    rws.enqueue("test.record", "1", unique="p1", unique_for=60)
    rws.enqueue("test.record", "2", unique="p2", unique_for=60)
    now = int(clock.now())
    UniqueWindow.objects.filter(job_id__in=Job.objects.filter(unique_key="p1").values("id")).update(until=now)
    assert prune_windows(Store(connection), now) == 1
    assert UniqueWindow.objects.count() == 1


def test_a_throttled_enqueue_beside_a_live_holder_takes_no_window():
    holder = rws.enqueue("test.record", "plain", unique="h")
    throttled = rws.enqueue("test.record", "throttled", unique="h", unique_for=60)
    assert (throttled, throttled.outcome) == (holder, "skipped")
    assert not UniqueWindow.objects.exists()


def test_a_throttle_inside_a_rolled_back_transaction_leaves_no_window():
    from django.db import transaction

    with pytest.raises(RuntimeError), transaction.atomic():
        rws.enqueue("test.record", "1", unique="rb", unique_for=60)
        raise RuntimeError("the view failed")
    assert not UniqueWindow.objects.exists() and not Job.objects.exists()
    assert rws.enqueue("test.record", "2", unique="rb", unique_for=60).outcome == "stored"


# -- bad input, enqueue_many, tasks ------------------------------------------------------------


@pytest.mark.parametrize(
    "options, error",
    [
        (
            {"on_conflict": "merge", "unique": "k"},
            "on_conflict must be one of 'skip', 'replace', got 'merge'",
        ),
        ({"on_conflict": "replace"}, "on_conflict='replace' needs unique=key"),
        ({"unique_for": 10}, "unique_for needs unique=key"),
        ({"unique": "k", "max_delay": 10}, "max_delay needs on_conflict='replace'"),
        (
            {"unique": "k", "unique_for": -1},
            "unique_for must be a finite number of seconds in (0, 31536000], got -1",
        ),
        (
            {"unique": "k", "unique_for": 0},
            "unique_for must be a finite number of seconds in (0, 31536000], got 0",
        ),
        (
            {"unique": "k", "on_conflict": "replace", "max_delay": float("nan")},
            "max_delay must be a finite number of seconds in [0, 31536000], got nan",
        ),
        ({"unique": "k", "on_conflict": "replace", "unique_for": 5}, "unique_for and on_conflict='replace'"),
        ({"unique": "k", "on_conflict": "replace", "after": []}, "on_conflict='replace' and after="),
        (
            {"unique": "k", "unique_for": "soon"},
            "unique_for must be a number of seconds or a timedelta, got str",
        ),
    ],
)
def test_bad_options_are_clear_errors(options, error):
    with pytest.raises((TypeError, ValueError)) as raised:
        rws.enqueue("test.record", "x", **options)
    assert error in str(raised.value)
    with pytest.raises((TypeError, ValueError)) as raised:
        rws.enqueue_many([{"job_type": "test.record", **options}])
    assert error in str(raised.value)
    assert not Job.objects.exists() and not UniqueWindow.objects.exists()


def test_enqueue_many_items_take_the_modes():
    ids = rws.enqueue_many(
        [
            {"job_type": "test.record", "payload": "a1", "unique": "ma", "on_conflict": "replace"},
            {"job_type": "test.record", "payload": "a2", "unique": "ma", "on_conflict": "replace"},
            {"job_type": "test.record", "payload": "t1", "unique": "mt", "unique_for": 60},
            {"job_type": "test.record", "payload": "t2", "unique": "mt", "unique_for": 60},
            ("test.record", "plain"),
        ]
    )
    assert [getattr(i, "outcome", "stored") for i in ids] == [
        "stored",
        "replaced",
        "stored",
        "skipped",
        "stored",
    ]
    assert ids[0] == ids[1] and ids[2] == ids[3]
    assert rows("ma") == [("pending", "a2")] and rows("mt") == [("pending", "t1")]


def test_a_throttled_task_returns_the_result_of_the_task_that_took_the_window():
    pytest.importorskip("django_rws_jobs.tasks.compat")
    from tests.testapp.tasks import throttled

    first = throttled.enqueue(7)
    drain()
    second = throttled.enqueue(7)
    assert second.id == first.id
    other = throttled.enqueue(8)  # other arguments, another key
    assert other.id != first.id


# -- many processes, real workers --------------------------------------------------------------

RACE = """
import json, sys
import django_rws_jobs as rws
out = []
for i in range({n}):
    key = f"key{{i % {keys}}}"
    got = rws.enqueue("test.payload_stable", f"{{key}}:{{i}}", unique=key, {options})
    out.append(got.outcome)
print(json.dumps(out))
"""


def race(n: int, keys: int, options: str, processes: int = 4) -> Counter:
    procs = [run_python(RACE.format(n=n, keys=keys, options=options)) for _ in range(processes)]
    outcomes: Counter = Counter()
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out
        outcomes.update(json.loads(out.strip().splitlines()[-1]))
    return outcomes


@pytest.mark.slow
def test_replaces_racing_in_many_processes_leave_one_waiting_job_per_key():
    outcomes = race(150, 5, "on_conflict='replace', run_in=3600")
    assert outcomes["stored"] == 5 and outcomes["replaced"] == 4 * 150 - 5, outcomes
    per_key = Counter(Job.objects.values_list("unique_key", flat=True))
    assert per_key == Counter({f"key{k}": 1 for k in range(5)})


@pytest.mark.slow
def test_throttles_racing_in_many_processes_store_one_job_per_window():
    outcomes = race(100, 3, "unique_for=3600")
    assert outcomes == Counter({"stored": 3, "skipped": 4 * 100 - 3}), outcomes
    assert Job.objects.count() == 3 and UniqueWindow.objects.count() == 3


@pytest.mark.slow
def test_replaces_beside_workers_never_change_a_running_job(workers):  # noqa: F811
    """Replaces race the workers that run their keys' jobs: no running job's row changes, each
    job stored runs once (or, a successor whose key a newer job took, is cancelled), and a key's
    jobs run one after another: a successor starts after its holder ended."""
    w = workers("--workers", "4", "--no-schedules", jobs={"POLL_INTERVAL": 0.05})
    w.started()
    outcomes = race(150, 3, "on_conflict='replace'")
    assert outcomes["stored"] >= 3 and sum(outcomes.values()) == 600, outcomes
    live = ("pending", "running", "waiting", "blocked")
    wait_for(
        lambda: not Job.objects.filter(status__in=live).exists(), 60, what=f"every job to end:\n{w.output()}"
    )
    assert not Run.objects.filter(kind="mutated").exists()  # no running job's row was changed
    cancelled = Job.objects.filter(status="cancelled")
    assert all("newer job" in job.last_error for job in cancelled)
    ran = Run.objects.filter(kind="stable").count()
    assert ran == outcomes["stored"] - cancelled.count()  # each stored job ran once
    for key in ("key0", "key1", "key2"):
        traces = Run.objects.filter(payload__startswith=f"{key}:").order_by("id")
        kinds = list(traces.values_list("kind", flat=True))
        assert kinds == ["started", "stable"] * (len(kinds) // 2), (key, kinds)  # never two at once


@pytest.mark.slow
def test_a_debounce_replaced_all_the_time_still_runs_within_max_delay(workers):  # noqa: F811
    w = workers("--workers", "1", "--no-schedules", jobs={"POLL_INTERVAL": 0.1})
    w.started()
    started = time.time()
    ran_at = None
    while time.time() - started < 8:
        rws.enqueue(
            "test.record", f"{time.time():.3f}", unique="burst", on_conflict="replace", run_in=2, max_delay=3
        )
        if ran_at is None and Run.objects.filter(kind="record").exists():
            ran_at = time.time()
        time.sleep(0.2)
    assert ran_at is not None, w.output()
    # Due 3 s after the burst's first enqueue at the latest (the queue's clock counts whole
    # seconds, and the worker polls every 0.1 s).
    assert ran_at - started < 3 + 1.5, ran_at - started
    assert Run.objects.filter(kind="record").count() >= 2  # each later burst ran too


@pytest.mark.slow
def test_a_worker_deletes_passed_windows(workers):  # noqa: F811
    rws.enqueue("test.record", "1", unique="gone", unique_for=1)
    kept = rws.enqueue("test.record", "2", unique="kept", unique_for=3600)
    w = workers("--workers", "1", "--no-schedules", jobs={"LEASE_SECONDS": 3, "RECOVERY_INTERVAL": 0.5})
    wait_for(
        lambda: list(UniqueWindow.objects.values_list("job_id", flat=True)) == [kept],
        30,
        what=f"the passed window to be deleted, the open one kept:\n{w.output()}",
    )


def test_a_task_throttle_needs_unique():
    tasks_api = pytest.importorskip("django_rws_jobs.tasks.compat")
    from tests.testapp.tasks import noop

    with pytest.raises(tasks_api.InvalidTask, match="unique_for needs unique=key"):
        noop.with_options(unique_for=60)
    with pytest.raises(tasks_api.InvalidTask, match=r"unique_for must be a finite number of seconds in \(0"):
        noop.with_options(unique=True, unique_for=-5)
