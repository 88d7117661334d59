import logging
import time

import pytest
from django.test import override_settings

import django_rws_jobs as rws
from django_rws_jobs.attempts.outcomes import backoff_delay, record
from django_rws_jobs.models import Job
from django_rws_jobs.queue.store import Store
from django_rws_jobs.signals import job_dead
from tests.features import skip_unless_db_feature

pytestmark = pytest.mark.django_db(transaction=True)


def drain():
    n = 0
    while rws.tick():
        n += 1
    return n


def test_order_is_priority_then_due_time_then_fifo(runs):
    now = int(time.time())
    rws.enqueue("test.record", "low", priority=-1)
    for i in range(30):  # many jobs in the same second keep their insertion order
        rws.enqueue("test.record", f"fifo-{i}")
    rws.enqueue("test.record", "high", priority=10)
    older = rws.enqueue("test.record", "older-due")
    Job.objects.filter(id=older).update(next_run_at=now - 100)
    assert drain() == 33
    assert [p for _, p in runs()] == ["high", "older-due", *[f"fifo-{i}" for i in range(30)], "low"]


def test_jobs_not_yet_due_are_left(runs):
    rws.enqueue("test.record", "later", run_in=3600)
    assert rws.tick() is False
    assert runs() == []


def test_queues_filter(runs):
    rws.enqueue("test.record", "a", queue="a")
    rws.enqueue("test.record", "b", queue="b")
    assert rws.tick(queues=["b"]) is True and rws.tick(queues=["b"]) is False
    assert runs() == [("record", "b")]


def test_a_one_queue_claim_takes_its_queue_in_order_whatever_the_queue_name():
    # One queue is claimed through the queue index; on PostgreSQL its name is written into the
    # statement, so quotes, backslashes and percent signs must come through as they are.
    from django.db import connection

    from django_rws_jobs.database.connections import private_connection

    odd = "o'k\\%s 50%% \\'; DROP TABLE rws_jobs; --"
    for p in range(3):
        rws.enqueue("test.record", f"odd{p}", queue=odd, priority=p)
    rws.enqueue("test.record", "other", queue="other", priority=9)
    rws.enqueue("test.record", "prefix", queue=odd[:4], priority=9)
    now = int(time.time())
    worker = Store(private_connection("default"))  # the worker's: prepared on PostgreSQL
    try:
        claimed = worker.claim("w#1", now, now + 60, [odd], 2)
    finally:
        worker.conn.close()
    assert [(j.payload, j.queue) for j in claimed] == [("odd2", odd), ("odd1", odd)]
    claimed = Store(connection).claim("w#2", now, now + 60, [odd], 2)
    assert [(j.payload, j.queue) for j in claimed] == [("odd0", odd)]
    pending = Job.objects.filter(status="pending").values_list("payload", flat=True)
    assert sorted(pending) == ["other", "prefix"]


def test_handler_runs_outside_any_transaction(runs):
    rws.enqueue("test.in_transaction", "x")
    assert rws.tick()
    assert runs() == [("autocommit", "x")]


def test_failure_is_retried_after_its_backoff_not_at_once(runs):
    job_id = rws.enqueue("test.fail", "1")
    before = time.time()
    assert rws.tick() is True
    job = Job.objects.get(id=job_id)
    assert (job.status, job.attempts) == ("pending", 1)
    assert job.last_error == "ValueError: boom 1"
    assert "Traceback" in job.traceback and "raise ValueError" in job.traceback
    assert job.next_run_at >= before + 0.5  # initial backoff 0.5 s, rounded up
    assert job.locked_by is None
    # The seed floors 0.5 s to 0 and runs the retry at once; here it waits.
    assert rws.tick() is False


@override_settings(
    RWS_JOBS={"BACKOFF_INITIAL": 2, "BACKOFF_MULTIPLIER": 3, "BACKOFF_MAX": 10, "BACKOFF_JITTER": 0}
)
def test_backoff_grows_and_is_capped():  # exact: no jitter (its spread: tests/test_outcomes.py)
    assert [backoff_delay(n) for n in (1, 2, 3, 4)] == [2, 6, 10, 10]
    job_id = rws.enqueue("test.fail", "x", max_retries=5)
    for attempt, delay in [(1, 2), (2, 6), (3, 10)]:
        Job.objects.filter(id=job_id).update(next_run_at=0)
        start = time.time()
        assert rws.tick()
        job = Job.objects.get(id=job_id)
        assert job.attempts == attempt
        assert start + delay <= job.next_run_at <= time.time() + delay + 1


def test_exhausted_job_moves_to_dead_letters_and_signals_once():
    seen = []

    def receiver(sender, job, **kwargs):
        seen.append((job.id, job.status, job.attempts, job.last_error))

    job_dead.connect(receiver)
    try:
        job_id = rws.enqueue("test.fail", "d", max_retries=1, unique="dead-key")
        assert rws.tick()
        Job.objects.filter(id=job_id).update(next_run_at=0)
        assert rws.tick()
    finally:
        job_dead.disconnect(receiver)
    job = Job.objects.get(id=job_id)
    assert (job.status, job.attempts, job.last_error) == ("failed", 2, "ValueError: boom d")
    assert job.failed_at is not None and job.unique_hash is None
    assert seen == [(job_id, "failed", 2, "ValueError: boom d")]
    assert rws.tick() is False  # the dead job is not run again
    assert rws.enqueue("test.fail", "d", unique="dead-key") != job_id  # and does not block its key


def test_max_retries_zero_fails_on_first_error():
    job_id = rws.enqueue("test.fail", "z", max_retries=0)
    rws.tick()
    assert Job.objects.get(id=job_id).status == "failed"


def test_a_raising_dead_receiver_is_logged_not_fatal(caplog):
    def bad(sender, job, **kwargs):
        raise RuntimeError("receiver broke")

    job_dead.connect(bad)
    try:
        job_id = rws.enqueue("test.fail", "r", max_retries=0)
        with caplog.at_level(logging.ERROR, logger="django_rws_jobs"):
            assert rws.tick() is True
    finally:
        job_dead.disconnect(bad)
    assert Job.objects.get(id=job_id).status == "failed"
    assert "job_dead receiver" in caplog.text and "receiver broke" in caplog.text


def test_unregistered_job_type_fails_with_the_seed_message():
    job_id = rws.enqueue("nobody.handles.this")
    assert rws.tick()
    job = Job.objects.get(id=job_id)
    assert job.last_error == "no handler registered for job_type 'nobody.handles.this'"
    assert (job.status, job.attempts) == ("pending", 1)


def test_late_result_from_a_taken_over_claim_changes_nothing(caplog):
    from django.db import connection

    job_id = rws.enqueue("test.record", "late")
    store = Store(connection)
    now = int(time.time())
    (mine,) = store.claim("worker-a#1", now, now + 60, None, 1)
    # Our lease expired and another worker took the job over.
    Job.objects.filter(id=job_id).update(locked_by="worker-b#7")
    with caplog.at_level(logging.WARNING, logger="django_rws_jobs"):
        assert record(store, mine, None, None) == "lost"
        assert record(store, mine, "ValueError: x", None) == "lost"
    job = Job.objects.get(id=job_id)
    assert (job.status, job.locked_by, job.attempts) == ("running", "worker-b#7", 0)
    assert "no longer holds it" in caplog.text


def test_claim_sets_a_lease():
    from django.db import connection

    rws.enqueue("test.record")
    now = int(time.time())
    (job,) = Store(connection).claim("w#1", now, now + 60, None, 1)
    row = Job.objects.get(id=job.id)
    assert (row.status, row.locked_by, row.locked_until, row.started_at) == ("running", "w#1", now + 60, now)


def test_a_claim_takes_jobs_in_order_up_to_its_limit():
    from django.db import connection

    for p in range(5):
        rws.enqueue("test.record", str(p), priority=p)
    now = int(time.time())
    claimed = Store(connection).claim("w#1", now, now + 60, None, 3)
    assert [j.payload for j in claimed] == ["4", "3", "2"]
    assert Job.objects.filter(status="pending").count() == 2


@pytest.mark.skipif(
    __import__("os").environ.get("RWS_TEST_DB", "sqlite") != "postgres", reason="PostgreSQL's planner"
)
@pytest.mark.parametrize("resuming", [False, True])
def test_a_claim_takes_no_more_jobs_than_asked_whatever_the_plan(resuming, monkeypatch):
    # Without hash aggregates and sorts, PostgreSQL planned the claim's IN (subquery) as a nested
    # loop semi join that ran the subquery again for each row, taking 10 jobs for a limit of 2.
    # A worker saw it under a held snapshot, with enable_sort off and the statistics of a table of
    # dead rows.
    from django.db import connection

    for i in range(10):
        rws.enqueue("test.record", str(i))
    with connection.cursor() as c:
        for setting in ("hashjoin", "mergejoin", "material", "hashagg", "sort"):
            c.execute(f"SET enable_{setting} = off")
    try:
        store = Store(connection)
        if resuming:
            store.resuming_until = float("inf")
        else:  # (not after a slow claim either)
            from django_rws_jobs.database.backends import postgresql

            monkeypatch.setattr(postgresql, "SLOW_CLAIM", 60.0)
        assert _claim(store, "w#1", 2) == ["0", "1"]
        assert (store.resume is not None) is resuming
        assert _claim(store, "w#2", 2) == ["2", "3"]
    finally:
        with connection.cursor() as c:
            c.execute("RESET ALL")


def _claim(store, token, limit):
    now = int(time.time())
    return [j.payload for j in store.claim(token, now, now + 60, None, limit)]


@skip_unless_db_feature("resumes_claims")
def test_a_claim_from_the_top_resumes_after_the_last_row_it_took(monkeypatch):
    # The next claim starts there (tests/test_explain.py shows the range it reads), for a while.
    from django.db import connection

    from django_rws_jobs.database.backends import base, postgresql

    monkeypatch.setattr(postgresql, "START_COST_FACTOR", 0)  # PostgreSQL: longer after a slow claim

    ids = [rws.enqueue("test.record", str(i)) for i in range(5)]
    store = Store(connection)
    store.resuming_until = float("inf")  # PostgreSQL resumes after a slow claim only (below)
    now = int(time.time())
    store.claim("w#1", now, now + 60, None, 2)
    row = Job.objects.get(id=ids[1])
    assert store.resume == (row.priority, row.next_run_at, row.created_at, row.id)
    kept = postgresql.MIN_RESUME_SECONDS if connection.vendor == "postgresql" else base.RESUME_SECONDS
    assert 0 < store.resume_until - time.monotonic() <= kept
    store.claim("w#2", now, now + 60, None, 2)
    assert store.resume[3] == ids[3]


@pytest.mark.skipif(
    __import__("os").environ.get("RWS_TEST_DB", "sqlite") != "postgres", reason="PostgreSQL's claim"
)
@pytest.mark.parametrize("slow", [False, True])
def test_a_postgresql_claim_resumes_after_a_slow_one_only(monkeypatch, slow):
    # A claim from the band's start that took longer than SLOW_CLAIM read dead entries: the claims
    # after it resume. A fast one did not, and resuming would cost CPU for nothing. The point is
    # kept for the shorter of the last two such claims: a worker's first claim, on a new
    # connection, is slow for reasons of its own, and keeps it the least time.
    from django.db import connection

    from django_rws_jobs.database.backends import postgresql

    monkeypatch.setattr(postgresql, "SLOW_CLAIM", 0.0 if slow else 60.0)
    monkeypatch.setattr(postgresql, "START_COST_FACTOR", 10_000)  # kept 10,000 times a claim's time
    for i in range(5):
        rws.enqueue("test.record", str(i))
    store = Store(connection)
    assert _claim(store, "w#1", 2) == ["0", "1"]
    assert (store.resume is not None) is slow
    assert (store.resuming_until > time.monotonic()) is slow
    if slow:  # the first claim alone: kept the shortest time
        kept = store.resume_until - time.monotonic()
        assert postgresql.MIN_RESUME_SECONDS - 0.1 < kept <= postgresql.MIN_RESUME_SECONDS
        store.resume_until = 0.0  # the point expires: the next claim starts from the top
        first = store.start_claim_took
        assert _claim(store, "w#2", 2) == ["2", "3"]
        kept = store.resume_until - time.monotonic()
        expected = min(postgresql.MAX_RESUME_SECONDS, 10_000 * min(first, store.start_claim_took))
        assert max(postgresql.MIN_RESUME_SECONDS, expected) - 0.5 < kept <= postgresql.MAX_RESUME_SECONDS
    else:
        assert _claim(store, "w#2", 2) == ["2", "3"]
    assert _claim(store, "w#3", 2) == ["4"]


@skip_unless_db_feature("resumes_with_queue_filter")
def test_a_point_made_under_another_queue_filter_is_dropped():
    # A worker that claimed from "b" alone (while "a" was paused) has a point past a's jobs; once
    # "a" is resumed it claims from every queue, and a's jobs, which sort before the point, come
    # first: the point belonged to the other filter.
    from django.db import connection

    a = [rws.enqueue("test.record", f"a{i}", queue="a") for i in range(2)]
    Job.objects.filter(id__in=a).update(next_run_at=int(time.time()) - 60)
    for i in range(4):
        rws.enqueue("test.record", f"b{i}", queue="b")
    store = Store(connection)
    store.resuming_until = float("inf")  # PostgreSQL: as after slow claims
    now = int(time.time())
    assert [j.payload for j in store.claim("w#1", now, now + 60, ["b"], 2)] == ["b0", "b1"]
    assert store.resume is not None and store.resume_queues == ("b",)
    assert _claim(store, "w#2", 3) == ["a0", "a1", "b2"]
    assert store.resume_queues is None


def _resuming_store():
    """A Store whose PostgreSQL claims resume (as after a slow claim from the band's start)."""
    from django.db import connection

    store = Store(connection)
    store.resuming_until = float("inf")
    return store


only_postgres = pytest.mark.skipif(
    __import__("os").environ.get("RWS_TEST_DB", "sqlite") != "postgres", reason="PostgreSQL's resumed claim"
)


@only_postgres
def test_a_resumed_claim_that_comes_back_short_looks_back_for_a_job_handed_back():
    # Rows that sort just before the point (a job handed back, a late commit, a retry due in the
    # point's second) are within LOOK_BACK of it: the first short claim takes them.
    for i in range(10):
        rws.enqueue("test.record", str(i))
    store = _resuming_store()
    first = store.claim("w#1", int(time.time()), int(time.time()) + 60, None, 4)
    assert [j.payload for j in first] == ["0", "1", "2", "3"]
    assert store.release(first[0])
    assert _claim(store, "w#2", 4) == ["4", "5", "6", "7"]  # after the point: enough
    assert _claim(store, "w#3", 4) == ["0", "8", "9"]  # short: and the one before it
    assert store.resume[3] == Job.objects.get(payload="9").id  # the point never moves back
    assert Job.objects.filter(status="pending").count() == 0


@only_postgres
def test_a_job_far_behind_a_resumed_point_waits_until_the_next_claim_from_the_start():
    # Further back than LOOK_BACK (enqueued with a due time in the past, say): short claims leave
    # it; the first claim after the point expires starts at the band's start and takes it.
    from django_rws_jobs.database.backends.postgresql import LOOK_BACK

    for i in range(3):
        rws.enqueue("test.record", str(i))
    store = _resuming_store()
    assert _claim(store, "w#1", 2) == ["0", "1"]
    old = rws.enqueue("test.record", "old")
    Job.objects.filter(id=old).update(next_run_at=int(time.time()) - LOOK_BACK - 5)
    assert _claim(store, "w#2", 2) == ["2"]
    assert _claim(store, "w#3", 2) == []
    store.resume_until = 0.0  # the point expires
    assert _claim(store, "w#4", 2) == ["old"]
    assert store.resume is not None and store.resume_until > time.monotonic()


@only_postgres
def test_a_resumed_claim_gives_way_to_a_band_above_its_point():
    for i in range(6):
        rws.enqueue("test.record", str(i))
    store = _resuming_store()
    assert _claim(store, "w#1", 2) == ["0", "1"]
    rws.enqueue("test.record", "high", priority=5)
    assert _claim(store, "w#2", 2) == ["high", "2"]  # its band first, then the point's
    assert _claim(store, "w#3", 2) == ["3", "4"]
    rws.enqueue("test.record", "low", priority=-5)
    assert _claim(store, "w#4", 3) == ["5", "low"]  # short: the bands below


def test_a_job_handed_back_behind_the_last_claim_is_taken_by_the_next_short_claim():
    # PostgreSQL's and MariaDB's claims start after the row the last one took (resume_point); a
    # job that sorts before that point must still be found: by the first claim that comes back short.
    from django.db import connection

    for i in range(10):
        rws.enqueue("test.record", str(i))
    store = Store(connection)
    first = store.claim("w#1", int(time.time()), int(time.time()) + 60, None, 4)
    assert [j.payload for j in first] == ["0", "1", "2", "3"]
    assert store.release(first[0])
    second, third = _claim(store, "w#2", 4), _claim(store, "w#3", 4)
    assert sorted(second + third) == ["0", "4", "5", "6", "7", "8", "9"]
    for claimed in (second, third):
        assert claimed == sorted(claimed)  # each claim in queue order
    assert Job.objects.filter(status="pending").count() == 0


def test_a_job_handed_back_behind_the_last_claim_is_in_order_again_after_resume_seconds(monkeypatch):
    from django.db import connection

    from django_rws_jobs.database.backends import base, postgresql

    monkeypatch.setattr(base, "RESUME_SECONDS", 0.2)
    # PostgreSQL, where a slow claim made the claims resume, keeps its point longer after a
    # slower claim from the start: not here.
    monkeypatch.setattr(postgresql, "MIN_RESUME_SECONDS", 0.2)
    monkeypatch.setattr(postgresql, "START_COST_FACTOR", 0)
    for i in range(10):
        rws.enqueue("test.record", str(i))
    store = Store(connection)
    now = int(time.time())
    first = store.claim("w#1", now, now + 60, None, 4)
    assert store.release(first[0])
    time.sleep(0.3)
    assert _claim(store, "w#2", 4) == ["0", "4", "5", "6"]


def test_a_higher_priority_job_enqueued_after_a_claim_comes_first():
    from django.db import connection

    for i in range(6):
        rws.enqueue("test.record", str(i))
    store = Store(connection)
    assert _claim(store, "w#1", 2) == ["0", "1"]
    high = rws.enqueue("test.record", "high", priority=5)
    Job.objects.filter(id=high).update(next_run_at=int(time.time()) - 100)  # before the last claim's row
    rws.enqueue("test.record", "high-2", priority=5)
    rws.enqueue("test.record", "low", priority=-5)
    assert _claim(store, "w#2", 1) == ["high"]
    assert _claim(store, "w#3", 2) == ["high-2", "2"]
    assert _claim(store, "w#4", 10) == ["3", "4", "5", "low"]


@pytest.mark.skipif(
    __import__("os").environ.get("RWS_TEST_DB", "sqlite") != "mysql",
    reason="MariaDB's claim sends BEGIN and COMMIT with its statements",
)
@pytest.mark.parametrize("resumed", [False, True])
def test_a_mariadb_claim_that_fails_midway_rolls_back_and_its_connection_claims_again(resumed):
    from django.db import DatabaseError, connection

    from django_rws_jobs.database.connections import private_connection

    with connection.cursor() as c:
        c.execute(
            "CREATE TRIGGER rws_test_boom BEFORE UPDATE ON rws_jobs FOR EACH ROW "
            "BEGIN IF NEW.locked_by = 'boom' THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'boom'; "
            "END IF; END"
        )
    store, other = Store(private_connection("default")), Store(private_connection("default"))
    try:
        for i in range(4):
            rws.enqueue("test.record", str(i))
        if resumed:  # the next claim starts after this one's row
            assert _claim(store, "w#0", 1) == ["0"]
        with pytest.raises(DatabaseError, match="boom"):
            _claim(store, "boom", 2)
        assert not Job.objects.filter(locked_by="boom").exists()
        # Nothing stayed locked (SKIP LOCKED would pass over it) and the connection works.
        assert _claim(other, "w#1", 10) == (["1", "2", "3"] if resumed else ["0", "1", "2", "3"])
        assert _claim(store, "w#2", 2) == []
        rws.enqueue("test.record", "later")
        assert _claim(store, "w#3", 2) == ["later"]
    finally:
        store.conn.close()
        other.conn.close()
        with connection.cursor() as c:
            c.execute("DROP TRIGGER rws_test_boom")


@pytest.mark.skipif(
    __import__("os").environ.get("RWS_TEST_MYSQL_DRIVER") != "pymysql",
    reason="the dj61:pymysql cell of scripts/test",
)
def test_under_pymysql_the_worker_claims_with_one_statement_per_call():
    """PyMySQL sends one statement per call (no CLIENT_MULTI_STATEMENTS): the claim's BEGIN, locking
    read, UPDATE and COMMIT go one by one. Before, every claim was a syntax error."""
    from django_rws_jobs.database.connections import private_connection, sends_several

    store = Store(private_connection("default"))
    try:
        ids = [rws.enqueue("test.record", str(i)) for i in range(3)]
        assert _claim(store, "w#1", 2) == ["0", "1"]
        assert type(store.conn.connection).__module__.startswith("pymysql")
        assert sends_several(store.conn) is False
        assert sorted(Job.objects.filter(locked_by="w#1").values_list("id", flat=True)) == sorted(ids[:2])
        assert _claim(store, "w#2", 5) == ["2"]
    finally:
        store.conn.close()


def test_tick_inside_a_transaction_keeps_it_usable_and_signals_after_commit(runs):
    from django.db import transaction

    from tests.testapp.models import Order

    seen = []

    def receiver(sender, job, **kwargs):
        seen.append(job.id)

    job_dead.connect(receiver)
    try:
        rws.enqueue("test.record", "in-atomic")
        dead = rws.enqueue("test.fail", "x", max_retries=0)
        with transaction.atomic():
            Order.objects.create(number="1")
            assert rws.tick() and rws.tick()
            Order.objects.create(number="2")  # the connection is still open and in the transaction
            assert seen == []  # not before the commit
        assert seen == [dead]
    finally:
        job_dead.disconnect(receiver)
    assert runs() == [("record", "in-atomic")] and Order.objects.count() == 2


@override_settings(RWS_JOBS={"LEASE_SECONDS": 2})
def test_tick_renews_the_lease_while_the_handler_runs(runs):
    import threading

    from django.db import connections

    from django_rws_jobs.attempts.outcomes import recover
    from django_rws_jobs.database.connections import private_connection

    job_id = rws.enqueue("test.sleep", "3")

    def run():
        try:
            rws.tick()
        finally:
            connections.close_all()

    t = threading.Thread(target=run)
    t.start()
    time.sleep(2.6)  # longer than the lease: without renewal it would have expired
    other = private_connection("default")
    try:
        assert recover(Store(other)) == 0
        assert Job.objects.get(id=job_id).status == "running"
    finally:
        other.close()
    t.join(10)
    assert runs("end") == [("end", "3")] and not Job.objects.filter(id=job_id).exists()


def _claim_statements(store, token, probe_first=False, queues=None):
    """(ids claimed, statements run on the job table) for one claim of one job."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    now = int(time.time())
    with CaptureQueriesContext(connection) as queries:
        claimed = store.claim(token, now, now + 60, queues, 1, probe_first=probe_first)
    return [j.id for j in claimed], [q["sql"] for q in queries if "rws_jobs" in q["sql"]]


@pytest.mark.parametrize("bands", [3, 40])
def test_bands_of_future_jobs_above_the_due_ones_cost_a_claim_one_walk(bands, monkeypatch):
    # Higher priorities hold only future jobs: a claim finds the due band in one statement
    # however many such bands there are, and then claims from it. (Claims that do not resume:
    # PostgreSQL's resume after a slow one, as the walk of 40 bands may be on a busy machine.)
    from django.db import connection

    from django_rws_jobs.database.backends import postgresql

    monkeypatch.setattr(postgresql, "SLOW_CLAIM", 60.0)

    for p in range(1, bands + 1):
        rws.enqueue("test.record", f"future-{p}", priority=p, run_in=3600)
    due = [rws.enqueue("test.record", f"due-{i}", priority=0) for i in range(3)]
    store = Store(connection)
    ids, first = _claim_statements(store, "w#1")
    assert ids == due[:1]

    def walks(statements):
        return sum("WITH RECURSIVE" in q or "GROUP BY" in q for q in statements)

    assert walks(first) == 1, first
    ids, second = _claim_statements(store, "w#2")
    assert ids == due[1:2] and walks(second) == 1, second
    idle_ids, idle = _claim_statements(Store(connection), "w#3", probe_first=True)
    assert idle_ids == due[2:] and walks(idle) == 1, idle
    if connection.vendor != "mysql":  # (MariaDB's claim statements run on the driver's cursor)
        # Tried the top band (future only), walked, claimed; then the walk comes first: no try.
        assert len(first) == 3 and len(second) == 2, (first, second)
        assert len(idle) == 3, idle  # any-due look, walk, claim


def test_a_walking_claim_still_takes_a_higher_band_that_becomes_due_first():
    from django.db import connection

    for p in range(1, 11):
        rws.enqueue("test.record", f"future-{p}", priority=p, run_in=3600)
    low = [rws.enqueue("test.record", f"low-{i}", priority=0) for i in range(2)]
    store = Store(connection)
    assert _claim_statements(store, "w#1")[0] == low[:1]
    high = rws.enqueue("test.record", "high", priority=5)
    top = rws.enqueue("test.record", "top", priority=99, run_in=3600)
    Job.objects.filter(id=top).update(next_run_at=int(time.time()) - 1)  # a future job falls due
    assert _claim_statements(store, "w#2")[0] == [top]
    assert _claim_statements(store, "w#3")[0] == [high]
    assert _claim_statements(store, "w#4")[0] == low[1:]
    assert _claim_statements(store, "w#5")[0] == []


@pytest.mark.parametrize("queues", [None, ["default"], ["default", "other"]])
def test_more_future_only_bands_than_a_walk_passes_still_find_the_due_band(queues):
    from django.db import connection

    from django_rws_jobs.database.backends.statements import MAX_BAND_WALK

    with connection.cursor() as c:  # one future job in each of more bands than a walk passes
        now = int(time.time())
        for p in range(1, MAX_BAND_WALK + 11):
            c.execute(
                "INSERT INTO rws_jobs (id, job_type, payload, next_run_at, created_at, priority, "
                "queue) VALUES (%s, 'test.record', '', %s, %s, %s, 'default')",
                [f"f{p}", now + 3600, now, p],
            )
    other = rws.enqueue("test.record", "other queue", priority=0, queue="other")
    due = [rws.enqueue("test.record", f"due-{i}", priority=-i) for i in range(2)]
    store = Store(connection)
    expect = due if queues == ["default"] else [other, *due]  # same priority and second: id order
    taken = [_claim_statements(store, f"w#{i}", queues=queues)[0] for i in range(len(expect) + 1)]
    assert taken == [[job] for job in expect] + [[]]


def test_many_bands_of_future_jobs_do_not_make_a_claim_walk_them_all():
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for p in range(1, 41):
        rws.enqueue("test.record", f"future-{p}", priority=p, run_in=3600)
    due = rws.enqueue("test.record", "due", priority=0)
    now = int(time.time())
    for probe_first in (True, False):
        with CaptureQueriesContext(connection) as queries:
            claimed = Store(connection).claim(
                f"w#{probe_first}", now, now + 60, None, 1, probe_first=probe_first
            )
        assert [j.id for j in claimed] == [due]
        assert len(queries) <= 20, [q["sql"] for q in queries]
        Job.objects.filter(id=due).update(status="pending")
    Job.objects.filter(id=due).delete()
    with CaptureQueriesContext(connection) as queries:
        assert Store(connection).claim("w#idle", now, now + 60, None, 1, probe_first=True) == []
    assert len(queries) == 1  # an idle look is one read
