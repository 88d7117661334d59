import datetime as dt
import math
import re
import time

import pytest
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

import django_rws_jobs as rws
from django_rws_jobs.models import Job
from tests.testapp.models import Order

pytestmark = pytest.mark.django_db(transaction=True)


def test_defaults():
    before = int(time.time())
    job = Job.objects.get(id=rws.enqueue("test.record"))
    after = int(time.time())
    assert (job.job_type, job.payload, job.status, job.attempts) == ("test.record", "", "pending", 0)
    assert (job.queue, job.priority, job.max_retries, job.unique_key) == ("default", 0, 3, None)
    assert before <= job.next_run_at <= after and before <= job.created_at <= after
    assert job.last_error is None


def test_options_are_stored():
    run_at = timezone.now() + dt.timedelta(hours=1)
    job = Job.objects.get(
        id=rws.enqueue("x.y", "p", queue="mailers", priority=-7, run_at=run_at, unique="k", max_retries=5)
    )
    assert (job.queue, job.priority, job.max_retries, job.unique_key) == ("mailers", -7, 5, "k")
    assert job.next_run_at == math.ceil(run_at.timestamp())


def test_job_decorator_options_are_defaults():
    job = Job.objects.get(id=rws.enqueue("test.mailer", "m"))
    assert (job.queue, job.priority, job.max_retries) == ("mailers", 5, 1)
    job = Job.objects.get(id=rws.enqueue("test.mailer", "m", queue="other", priority=0, max_retries=0))
    assert (job.queue, job.priority, job.max_retries) == ("other", 0, 0)


@override_settings(RWS_JOBS={"MAX_RETRIES": 9})
def test_max_retries_default_comes_from_settings():
    assert Job.objects.get(id=rws.enqueue("x")).max_retries == 9


def test_unregistered_job_type_is_accepted():
    assert Job.objects.filter(id=rws.enqueue("handled.elsewhere")).exists()


def test_run_in_is_resolved_at_enqueue_and_rounded_up():
    # The seed resolves run_in when its options object is built; here it is when enqueue runs.
    before = time.time()
    job = Job.objects.get(id=rws.enqueue("x", run_in=dt.timedelta(seconds=10)))
    assert math.ceil(before + 10) <= job.next_run_at <= math.ceil(time.time() + 10)
    job = Job.objects.get(id=rws.enqueue("x", run_in=0.2))
    assert job.next_run_at >= before + 0.2  # never due before the delay has passed


def test_run_at_in_the_past_is_due_now_and_fractional_rounds_up():
    past = timezone.now() - dt.timedelta(days=1)
    job = Job.objects.get(id=rws.enqueue("x", run_at=past))
    assert job.next_run_at == math.ceil(past.timestamp())
    at = dt.datetime(2030, 1, 1, 0, 0, 0, 1, tzinfo=dt.timezone.utc)
    assert Job.objects.get(id=rws.enqueue("x", run_at=at)).next_run_at == int(at.timestamp()) + 1


@override_settings(USE_TZ=False, TIME_ZONE="UTC")
def test_naive_run_at_is_local_time_when_use_tz_is_off():
    at = dt.datetime(2030, 1, 1, 12, 0, 0)
    job = Job.objects.get(id=rws.enqueue("x", run_at=at))
    assert job.next_run_at == int(at.replace(tzinfo=dt.timezone.utc).timestamp())


@pytest.mark.parametrize(
    "kwargs, exc, message",
    [
        ({"job_type": ""}, ValueError, "job_type must not be empty"),
        ({"job_type": None}, TypeError, "job_type must be a str, got NoneType"),
        ({"job_type": 42}, TypeError, "job_type must be a str, got int"),
        ({"payload": None}, TypeError, "payload must be a str, got NoneType"),
        ({"payload": b"bytes"}, TypeError, "payload must be a str, got bytes"),
        ({"payload": 42}, TypeError, "payload must be a str, got int"),
        ({"payload": "a\x00b"}, ValueError, "contains a NUL character"),
        ({"payload": "\ud800"}, ValueError, "is not valid Unicode text"),
        ({"queue": "q" * 65}, ValueError, "queue name 'qqqq"),
        ({"queue": "q" * 65}, ValueError, "is 65 characters; the limit is 64"),
        ({"queue": ""}, ValueError, "queue name must not be empty"),
        ({"unique": "u" * 192}, ValueError, "is 192 characters; the limit is 191"),
        ({"unique": 5}, TypeError, "unique key must be a str, got int"),
        ({"run_at": dt.datetime(2030, 1, 1)}, ValueError, "naive datetime while USE_TZ is on"),
        ({"run_at": "2030-01-01"}, TypeError, "run_at must be a datetime"),
        ({"run_at": timezone.now(), "run_in": 5}, ValueError, "give run_at or run_in, not both"),
        ({"run_in": -1}, ValueError, "run_in -1 must be a finite, non-negative delay"),
        ({"run_in": float("nan")}, ValueError, "finite, non-negative"),
        ({"run_in": "5"}, TypeError, "run_in must be a timedelta or seconds"),
        ({"run_in": 1e19}, ValueError, "run_in 1e+19 is too far ahead; the limit is"),
        ({"max_retries": -1}, ValueError, "max_retries -1 is out of range"),
        ({"max_retries": 2**31}, ValueError, "max_retries 2147483648 is out of range"),
        ({"max_retries": 1.5}, TypeError, "max_retries must be an int"),
        ({"priority": True}, TypeError, "priority must be an int, got bool"),
        ({"priority": 2**63}, ValueError, "priority 9223372036854775808 is out of range"),
        ({"using": "nope"}, ValueError, "database alias 'nope' is not in DATABASES"),
    ],
)
def test_bad_input_is_rejected_before_anything_is_written(kwargs, exc, message):
    args = {"job_type": "x", "payload": "p", **kwargs}
    with pytest.raises(exc) as info:
        rws.enqueue(args.pop("job_type"), args.pop("payload"), **args)
    assert message in str(info.value)
    assert Job.objects.count() == 0


def test_large_and_unicode_payloads_round_trip():
    payload = "émoji 🎉 " + "x" * 200_000
    job_id = rws.enqueue("x", payload)
    assert Job.objects.get(id=job_id).payload == payload


def test_enqueue_joins_the_callers_transaction():
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            Order.objects.create(number="1")
            rws.enqueue("x", "rolled back")
            raise RuntimeError("view failed")
    assert Order.objects.count() == 0 and Job.objects.count() == 0
    with transaction.atomic():
        Order.objects.create(number="2")
        job_id = rws.enqueue("x", "committed")
    assert Job.objects.get(id=job_id).payload == "committed"


def test_enqueue_in_a_transaction_is_invisible_to_other_connections_until_commit():
    from django.db import connections

    other = connections.create_connection("default")
    try:
        with transaction.atomic():
            job_id = rws.enqueue("x")
            with other.cursor() as c:
                c.execute("SELECT COUNT(*) FROM rws_jobs WHERE id = %s", [job_id])
                assert c.fetchone()[0] == 0
        with other.cursor() as c:
            c.execute("SELECT COUNT(*) FROM rws_jobs WHERE id = %s", [job_id])
            assert c.fetchone()[0] == 1
    finally:
        other.close()


def test_enqueue_goes_through_djangos_cursor_wrappers_and_query_log(django_assert_num_queries):
    seen = []

    def wrapper(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    rws.enqueue("x", "first")  # enqueue keeps a cursor from here on
    with connection.execute_wrapper(wrapper):
        wrapped = rws.enqueue("x", "wrapped")
    assert len(seen) == 1 and seen[0].startswith("INSERT INTO rws_jobs")
    with django_assert_num_queries(1) as captured:
        rws.enqueue("x", "logged")
    assert captured.captured_queries[0]["sql"].startswith("INSERT INTO rws_jobs")
    assert Job.objects.get(id=wrapped).payload == "wrapped"
    assert sorted(Job.objects.values_list("payload", flat=True)) == ["first", "logged", "wrapped"]


def test_enqueue_reconnects_after_the_connection_was_closed():
    first = rws.enqueue("x", "1")
    connection.close()
    second = rws.enqueue("x", "2")
    payloads = Job.objects.filter(id__in=[first, second]).order_by("id").values_list("payload", flat=True)
    assert list(payloads) == ["1", "2"]


def test_enqueue_in_a_transaction_broken_by_an_error_is_refused():
    from django.db import DatabaseError
    from django.db.transaction import TransactionManagementError

    rws.enqueue("x", "before")
    with transaction.atomic():
        Order.objects.create(number="1")
        with pytest.raises(DatabaseError):
            with transaction.atomic(savepoint=False), connection.cursor() as c:
                c.execute("SELECT * FROM no_such_table")
        with pytest.raises(TransactionManagementError):
            rws.enqueue("x", "in a broken transaction")
    assert list(Job.objects.values_list("payload", flat=True)) == ["before"]
    assert Order.objects.count() == 0


# -- unique jobs ------------------------------------------------------------------------------


def test_unique_returns_the_active_jobs_id():
    first = rws.enqueue("x", "a", unique="k")
    assert rws.enqueue("x", "b", unique="k") == first
    assert Job.objects.count() == 1
    # Another job_type, or another key, is a different job.
    assert rws.enqueue("y", unique="k") != first
    assert rws.enqueue("x", unique="k2") != first
    assert Job.objects.count() == 3


def test_unique_is_held_while_running_and_released_when_failed_or_done():
    first = rws.enqueue("x", unique="k")
    Job.objects.filter(id=first).update(status="running")
    assert rws.enqueue("x", unique="k") == first
    # A failed job does not block: the worker clears its hold when it buries it.
    Job.objects.filter(id=first).update(status="failed", unique_hash=None)
    second = rws.enqueue("x", unique="k")
    assert second != first
    Job.objects.filter(id=second).delete()
    assert rws.enqueue("x", unique="k") not in (first, second)


def test_unique_ignores_a_failed_row_that_still_holds_the_key():
    # A rust-web-server writer fails a job without clearing our unique_hash column.
    first = rws.enqueue("x", unique="k")
    Job.objects.filter(id=first).update(status="failed")
    second = rws.enqueue("x", unique="k")
    assert second != first
    assert Job.objects.get(id=first).unique_hash is None


def test_unique_inside_a_transaction_keeps_the_transaction_usable():
    first = rws.enqueue("x", unique="k")
    with transaction.atomic():
        Order.objects.create(number="1")
        assert rws.enqueue("x", unique="k") == first
        Order.objects.create(number="2")
    assert Order.objects.count() == 2


def test_unique_rolled_back_with_the_caller_frees_the_key():
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            rws.enqueue("x", unique="k")
            raise RuntimeError
    assert Job.objects.count() == 0
    rws.enqueue("x", unique="k")
    assert Job.objects.count() == 1


def test_ids_are_unique_time_ordered_and_fit_the_column():
    ids = [rws.enqueue("x") for _ in range(200)]
    assert len(set(ids)) == 200
    assert ids == sorted(ids)
    assert all(len(i) <= 64 for i in ids)


# -- enqueue_many -----------------------------------------------------------------------------


def test_enqueue_many_stores_all_in_order_with_options():
    ids = rws.enqueue_many(
        ["a", ("b", "pb"), {"job_type": "c", "payload": "pc", "queue": "q", "priority": 3}]
        + [("bulk", str(i)) for i in range(2500)]
    )
    assert len(ids) == 2503 and len(set(ids)) == 2503
    stored = {j.id: j for j in Job.objects.all()}
    assert (stored[ids[0]].job_type, stored[ids[1]].payload) == ("a", "pb")
    assert (stored[ids[2]].queue, stored[ids[2]].priority) == ("q", 3)
    assert [stored[i].payload for i in ids[3:]] == [str(i) for i in range(2500)]


def test_enqueue_many_stores_any_text_exactly():
    texts = [
        "it's",
        'say "hi"',
        "back\\slash \\'",
        "100% %s %(x)s",
        "naïve ☃ 𝄞",
        "new\nline\ttab\r",
        "",
        "'); DELETE FROM rws_jobs; --",
        "\x1a\b",
    ]
    items = [{"job_type": f"t'{i}", "payload": t, "queue": "q\\'"} for i, t in enumerate(texts)]
    ids = rws.enqueue_many(items * 2)  # each value twice: quoted once, used twice (MySQL)
    stored = {j.id: (j.job_type, j.payload, j.queue) for j in Job.objects.all()}
    assert [stored[i] for i in ids] == [(f"t'{i}", t, "q\\'") for i, t in enumerate(texts)] * 2


def test_enqueue_many_error_in_a_later_batch_rolls_back_the_call_and_leaves_the_connection_usable(
    monkeypatch,
):
    """The MySQL path sends each batch before building the next; a batch the database refuses
    must surface as Django's IntegrityError, leave nothing of the call, and leave the connection
    in step for the next statement. (PostgreSQL's COPY must raise Django's error too.)"""
    from django.db import IntegrityError

    from django_rws_jobs.queue import ids as ids_module

    taken = rws.enqueue("x", "first")
    real, calls = ids_module.new_id, []

    def new_id():  # the 25th id repeats the stored job's: batch 3 of 6 is refused
        calls.append(1)
        return taken if len(calls) == 25 else real()

    monkeypatch.setattr(ids_module, "new_id", new_id)
    with pytest.raises(IntegrityError):
        rws.enqueue_many([("x", str(i)) for i in range(60)], batch_size=10)
    monkeypatch.setattr(ids_module, "new_id", real)
    assert list(Job.objects.values_list("payload", flat=True)) == ["first"]
    after = rws.enqueue_many([("x", str(i)) for i in range(35)], batch_size=10)
    assert sorted(Job.objects.exclude(id=taken).values_list("id", flat=True)) == sorted(after)


def test_enqueue_many_statements_are_seen_by_execute_wrappers_and_the_query_log():
    """Wrappers get each statement as a str, as Django documents (MariaDB's pipelined INSERTs
    were bytes); PostgreSQL's COPY, which no wrapper or log sees, gives way to INSERTs then."""
    from django.test.utils import CaptureQueriesContext

    seen = []

    def wrapper(execute, sql, params, many, context):
        seen.append((type(sql), sql.upper().startswith("INSERT INTO RWS_JOBS")))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        first = rws.enqueue_many([("x", str(i)) for i in range(25)], batch_size=10)
    assert {kind for kind, _ in seen} == {str} and sum(insert for _, insert in seen) == 3
    with CaptureQueriesContext(connection) as captured:
        second = rws.enqueue_many([("x", str(i)) for i in range(25)], batch_size=10)
    assert sum(q["sql"].startswith("INSERT INTO rws_jobs") for q in captured.captured_queries) == 3
    assert sorted(Job.objects.filter(id__in=first + second).values_list("payload", flat=True)) == sorted(
        [str(i) for i in range(25)] * 2
    )


@pytest.mark.skipif(connection.vendor != "mysql", reason="MariaDB's max_allowed_packet")
@pytest.mark.parametrize("watched", [False, True])
def test_enqueue_many_splits_statements_by_the_servers_packet_limit(watched):
    """1,000 jobs whose rows add up to more than max_allowed_packet (16 MiB by default) go in, in
    as many statements as they need; the server refused the lot before (error 1153). ``watched``:
    the path through the cursor, which PyMySQL and execute wrappers take."""
    from contextlib import nullcontext

    with connection.cursor() as c:
        c.execute("SELECT @@max_allowed_packet")
        limit = c.fetchone()[0]
    size = limit // 800
    items = [("x", f"{i:04d}" + "'\\" * (size // 3)) for i in range(1000)]  # escaped: ~1.6x as SQL
    wrapped = connection.execute_wrapper(lambda execute, *a: execute(*a)) if watched else nullcontext()
    with wrapped:
        ids = rws.enqueue_many(items)
    assert len(ids) == 1000
    stored = dict(Job.objects.filter(id__in=ids).values_list("id", "payload"))
    assert [stored[i] for i in ids] == [p for _, p in items]


@pytest.mark.skipif(connection.vendor != "mysql", reason="MariaDB's max_allowed_packet")
def test_a_job_bigger_than_the_servers_packet_limit_is_refused_naming_it():
    with connection.cursor() as c:
        c.execute("SELECT @@max_allowed_packet")
        limit = c.fetchone()[0]
    big = "x" * limit
    allows = rf"max_allowed_packet allows statements of {limit - 1:,} bytes"
    about = r"its INSERT statement is about [\d,]+ bytes; "
    with pytest.raises(ValueError, match=rf"job #2: {about}.*{allows}") as info:
        rws.enqueue_many([("x", "a"), ("x", "b"), ("x", big), ("x", "c")])
    size = re.search(r"about ([\d,]+) bytes", str(info.value)).group(1)
    assert limit < int(size.replace(",", "")) < limit + 1000
    with pytest.raises(ValueError, match=rf"job #1: its INSERT statement is about .*{allows}"):
        rws.enqueue_many([("x", "a"), {"job_type": "x", "payload": big, "unique": "k"}])
    with transaction.atomic():
        kept = rws.enqueue("x", "kept")
        with pytest.raises(ValueError, match=rf"the job: its INSERT statement is about .*{allows}"):
            rws.enqueue("x", big)
    assert list(Job.objects.values_list("id", flat=True)) == [kept]  # the connection kept its transaction


def test_enqueue_many_bad_item_after_written_batches_stores_nothing_of_the_call():
    """Rows go in while later items are validated; a bad item late in the call rolls back the
    batches already sent (on PostgreSQL the COPY is aborted), keeps the caller's earlier work and
    leaves the connection usable."""
    items = [("x", str(i)) for i in range(2500)] + [("x", None)] + [("x", "after")] * 10
    with pytest.raises(TypeError, match=r"job #2500: payload must be a str, got NoneType"):
        rws.enqueue_many(items, batch_size=1000)
    assert Job.objects.count() == 0
    with transaction.atomic():
        kept = rws.enqueue("x", "kept")
        with pytest.raises(ValueError, match=r"job #1200: priority 9223372036854775808 is out of range"):
            rws.enqueue_many([("x", "in")] * 1200 + [{"job_type": "x", "priority": 2**63}], batch_size=500)
        also = rws.enqueue_many([("x", "also")] * 3, batch_size=2)
    assert sorted(Job.objects.values_list("id", flat=True)) == sorted([kept, *also])


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's limit on a statement's parameters")
def test_enqueue_many_keeps_each_sqlite_statement_within_the_parameter_limit():
    """SQLite builds differ in how many parameters a statement may have (999 before 3.32, 32,766
    by default since, 250,000 in Debian's); a batch of 1,000 rows has 10,000."""
    import sqlite3

    connection.ensure_connection()
    raw = connection.connection
    if not hasattr(raw, "setlimit"):
        pytest.skip("sqlite3.Connection.setlimit needs Python 3.11")
    before = raw.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999)
    try:
        ids = rws.enqueue_many([("x", str(i)) for i in range(2500)], batch_size=1000)
    finally:
        raw.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, before)
    assert sorted(Job.objects.values_list("id", flat=True)) == sorted(ids) and len(ids) == 2500


def test_enqueue_many_names_the_bad_item_and_stores_nothing():
    with pytest.raises(TypeError, match=r"job #2: payload must be a str, got NoneType"):
        rws.enqueue_many([("a", "1"), ("a", "2"), ("a", None)])
    with pytest.raises(ValueError, match=r"job #1: queue name 'qqqq.*is 65 characters; the limit is 64"):
        rws.enqueue_many([{"job_type": "a"}, {"job_type": "a", "queue": "q" * 65}])
    with pytest.raises(TypeError, match="job #0: a job must be"):
        rws.enqueue_many([42])
    assert Job.objects.count() == 0


def test_enqueue_many_keeps_unique_semantics_and_the_callers_transaction():
    held = rws.enqueue("u", unique="k1")
    ids = rws.enqueue_many(
        [
            {"job_type": "u", "unique": "k1"},
            {"job_type": "u", "unique": "k2"},
            {"job_type": "u", "unique": "k2"},
            "plain",
        ]
    )
    assert ids[0] == held and ids[1] == ids[2] != held
    assert Job.objects.count() == 3
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            rws.enqueue_many(["x", "y"])
            raise RuntimeError
    assert Job.objects.count() == 3


@pytest.mark.skipif(
    connection.vendor == "sqlite",
    reason="SQLite has one writer: an open write transaction blocks every other writer anyway",
)
def test_a_duplicate_unique_enqueue_does_not_lock_the_holder():
    # A caller whose transaction found the key taken must not keep the holder from being claimed.
    import time as _time

    from django_rws_jobs.database.connections import private_connection
    from django_rws_jobs.queue.store import Store

    holder = rws.enqueue("x", unique="k")
    other = private_connection("default")
    try:
        with transaction.atomic():
            assert rws.enqueue("x", unique="k") == holder
            now = int(_time.time())
            claimed = Store(other).claim("w#1", now, now + 60, None, 1)
            assert [j.id for j in claimed] == [holder]
    finally:
        other.close()
