"""Metadata, progress and save_metadata(): what a job carries and what its running handler tells
(running/context.py, running/reports.py)."""

from __future__ import annotations

import json
import math
import threading
import time

import pytest
from django.db import connection, connections

import django_rws_jobs as rws
from django_rws_jobs.models import Job, Status
from django_rws_jobs.running import reports
from tests.test_worker import wait_for, workers  # noqa: F401  (a fixture)
from tests.testapp.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


def traced(kind: str) -> list[str]:
    return list(Run.objects.filter(kind=kind).order_by("id").values_list("payload", flat=True))


# -- metadata at enqueue -------------------------------------------------------------------------


def test_enqueue_keeps_the_metadata_and_the_job_reads_it():
    job_id = rws.enqueue("test.record", "x", metadata={"tenant": 3, "trace": {"id": "abc"}, "name": "Zoë"})
    assert Job.objects.get(id=job_id).metadata == {"tenant": 3, "trace": {"id": "abc"}, "name": "Zoë"}
    assert Job.objects.filter(metadata__tenant=3).count() == 1
    assert Job.objects.get(id=rws.enqueue("test.record", "y")).metadata is None


def test_enqueue_many_items_and_callbacks_carry_metadata():
    ids = rws.enqueue_many(
        [{"job_type": "test.record", "metadata": {"n": 1}}, "test.record", {"job_type": "test.record"}]
    )
    assert [Job.objects.get(id=i).metadata for i in ids] == [{"n": 1}, None, None]
    Job.objects.all().delete()
    with rws.batch(on_success=rws.call("test.metadata", "callback", metadata={"cb": True})):
        rws.enqueue("test.metadata", "member", metadata={"m": 1})
    while rws.tick():
        pass
    assert [json.loads(t) for t in traced("metadata")] == [["member", {"m": 1}], ["callback", {"cb": True}]]


@pytest.mark.parametrize(
    ("metadata", "error", "message"),
    [
        ([1, 2], TypeError, r"^metadata must be a dict, got list \[1, 2\]$"),
        ({"s": {1, 2}}, TypeError, r"^metadata must be JSON: Object of type set is not JSON serializable$"),
        ({"x": float("nan")}, TypeError, r"^metadata must be JSON: Out of range float values"),
        (
            {"x": "y" * 70_000},
            ValueError,
            r"^metadata is 70008 bytes of JSON; the limit is 65536 \(METADATA_MAX_BYTES\)$",
        ),
    ],
)
def test_bad_metadata_is_a_clear_error_and_stores_nothing(metadata, error, message):
    with pytest.raises(error, match=message):
        rws.enqueue("test.record", "x", metadata=metadata)
    with pytest.raises(error, match="^job #1: " + message[1:]):
        rws.enqueue_many(["test.record", {"job_type": "test.record", "metadata": metadata}])
    assert not Job.objects.exists()


# -- in the handler, through tick() --------------------------------------------------------------


@pytest.mark.parametrize("fail", [False, True])
def test_a_handler_reads_changes_and_saves_the_metadata(fail):
    job_id = rws.enqueue(
        "test.report",
        json.dumps({"set": {"stage": "parse"}, "after": {"rows": 7}, "steps": 3, "fail": fail}),
        metadata={"tenant": 3},
    )
    assert rws.tick()
    assert traced("saved") == ["true"]
    if fail:  # what the handler changed after its save is saved when the attempt ends
        job = Job.objects.get(id=job_id)
        assert job.status == Status.FAILED
        assert job.metadata == {"tenant": 3, "stage": "parse", "rows": 7}
        progress = rws.get_progress(job_id)
        assert (progress.current, progress.total, progress.message) == (3, 3, "step 3")
        assert progress.fraction == 1.0
    else:
        assert not Job.objects.filter(id=job_id).exists()
        assert rws.get_progress(job_id) is None


def test_inside_a_test_transaction_the_reports_use_the_callers_connection():
    from django.db import transaction

    with transaction.atomic():  # as a TestCase would: no other connection sees the job
        job_id = rws.enqueue("test.report", json.dumps({"set": {"a": 1}, "steps": 2, "fail": True}))
        assert rws.tick()
        assert traced("saved") == ["true"]
        assert Job.objects.get(id=job_id).metadata == {"a": 1}
        assert rws.get_progress(job_id).current == 2


def test_a_lost_claim_writes_nothing():
    job_id = rws.enqueue("test.report_lost", metadata={"kept": True})
    assert rws.tick()
    assert traced("saved") == ["false"]
    row = Job.objects.get(id=job_id)
    assert row.metadata == {"kept": True}
    assert row.progress is None


def test_progress_in_a_tight_loop_costs_a_few_writes(monkeypatch):
    statements = []
    real = reports.Writer._execute

    def counted(self, sql, params):
        statements.append(sql)
        return real(self, sql, params)

    monkeypatch.setattr(reports.Writer, "_execute", counted)
    rws.enqueue("test.report_loop", "2.5")
    assert rws.tick()
    calls = int(traced("loop")[0])
    assert calls > 10_000
    # One write a second at most, the first at once: 2.5 s of reports is at most 4 writes.
    assert 1 <= len(statements) <= 4, (calls, statements)


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        (("1",), TypeError, r"^progress\(\): current must be a number, got str '1'$"),
        ((True,), TypeError, r"^progress\(\): current must be a number, got bool True$"),
        ((1, float("inf")), ValueError, r"^progress\(\): total must be a finite number, got inf$"),
        ((1, 2, "m" * 1001), ValueError, r"progress\(\)'s message"),
        (
            (10**400, 3),
            ValueError,
            r"^progress\(\): current \(a 1329-bit integer\) is out of range; "
            r"it must be between -9007199254740992 and 9007199254740992$",
        ),
        (
            (1, -1e300),
            ValueError,
            r"^progress\(\): total -1e\+300 is out of range; it must be between -9007199254740992 and",
        ),
        ((2**53, 2**53 + 1), ValueError, r"^progress\(\): total 9007199254740993 is out of range"),
    ],
)
def test_bad_progress_is_a_clear_error(args, error, message):
    from django_rws_jobs.database.backends.claimed import Claimed
    from django_rws_jobs.running.context import JobContext

    job = JobContext(Claimed.stand_in("x"), "default", inline_writes=True)
    with pytest.raises(error, match=message):
        job.progress(*args)
    assert job._progress is None


def test_on_sqlite_a_save_inside_a_transaction_is_written_with_it():
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's one write lock")
    job_id = rws.enqueue("test.report", json.dumps({"atomic": True, "set": {"a": 1}, "fail": True}))
    started = time.monotonic()
    assert rws.tick()
    assert time.monotonic() - started < 5  # no wait for a lock its own transaction holds
    assert Job.objects.get(id=job_id).metadata == {"a": 1}


@pytest.mark.parametrize(
    "stored, current, total, message",
    [
        ('{"current": 1%s, "total": 3, "message": "m"}' % ("0" * 400), None, 3, "m"),
        ('{"current": 2, "total": 1%s}' % ("0" * 400), 2, None, None),
        ('{"current": "2", "total": [3], "message": 7}', None, None, None),
        ("[1, 2]", None, None, None),
        ("not json", None, None, None),
    ],
)
def test_a_stored_report_out_of_range_reads_without_an_error(stored, current, total, message):
    """progress() refuses such numbers, but a row written by another program can hold any text:
    it reads as NaN for a current and None for what cannot be taken (queue/progress.py)."""
    job_id = rws.enqueue("test.record", "x")
    Job.objects.filter(id=job_id).update(progress=stored, progress_at=1.0)
    p = rws.get_progress(job_id)
    assert (p.total, p.message) == (total, message)
    assert p.current == current if current is not None else math.isnan(p.current)
    assert p.fraction is None


def test_get_progress_of_an_unknown_job_is_none():
    assert rws.get_progress("no-such-job") is None


# -- a real worker: seen from another process while the handler's transaction is open ------------


@pytest.mark.slow
@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_progress_is_seen_while_the_handler_holds_a_transaction(workers, pool, tmp_path):  # noqa: F811
    flags = [str(tmp_path / "saved"), str(tmp_path / "end")]
    job_id = rws.enqueue(
        "test.report",
        json.dumps(
            {
                "steps": 5,
                # On SQLite a transaction holds the file's one write lock from its start (IMMEDIATE):
                # nothing else writes until it ends (the test below).
                "atomic": connection.vendor != "sqlite",
                "write": connection.vendor != "sqlite",
                "flags": flags,
                "set": {"stage": "parse"},
                "after": {"rows": 7},
                "fail": True,
            }
        ),
        metadata={"tenant": 3},
    )
    workers("--workers", "1", "--pool", pool)

    def reported() -> bool:
        p = rws.get_progress(job_id)
        return p is not None and p.current == 5

    wait_for(reported, what="the progress, written while the handler's transaction is open")
    p = rws.get_progress(job_id)
    assert (p.current, p.total, p.message) == (5, 5, "step 5")
    assert Job.objects.get(id=job_id).status == Status.RUNNING
    assert not Run.objects.filter(kind="report-inside").exists()  # the handler's own write: not committed
    assert Job.objects.get(id=job_id).metadata == {"tenant": 3}

    open(flags[0], "w").close()
    wait_for(lambda: Job.objects.get(id=job_id).metadata == {"tenant": 3, "stage": "parse"}, what="the save")
    assert Job.objects.get(id=job_id).status == Status.RUNNING

    open(flags[1], "w").close()
    wait_for(lambda: Job.objects.get(id=job_id).status == Status.FAILED, what="the job's failure")
    # The handler's transaction rolled back; what the worker wrote stays on the dead row.
    assert not Run.objects.filter(kind="report-inside").exists()
    assert Job.objects.get(id=job_id).metadata == {"tenant": 3, "stage": "parse", "rows": 7}
    assert rws.get_progress(job_id).current == 5


@pytest.mark.slow
@pytest.mark.parametrize("job_type", ["test.report_stall", "test.report_stall_async"])
@pytest.mark.parametrize("end", ["timeout", "cancel"])
@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_a_stopped_attempt_keeps_its_metadata_and_last_progress(workers, pool, end, job_type):  # noqa: F811
    """JobTimeout, JobCancelled and a child's SystemExit are no Exceptions: the attempt's end writes
    the handler's unsaved metadata and its last progress all the same, before its outcome is
    recorded (run.execute). The handler holds the writer's rounds off: only that end writes."""
    job_id = rws.enqueue(job_type, end, metadata={"tenant": 3}, timeout=1 if end == "timeout" else None)
    w = workers("--workers", "1", "--pool", pool, jobs={"TIMEOUT_GRACE": 30, "POLL_INTERVAL": 0.1})
    wait_for(lambda: traced("stalling") == [end], what="the handler to stall" + w.output())
    if end == "cancel":
        assert rws.cancel(job_id)
    status = Status.FAILED if end == "timeout" else Status.CANCELLED
    wait_for(lambda: Job.objects.get(id=job_id).status == status, what=f"the job {status}" + w.output())
    job = Job.objects.get(id=job_id)
    assert job.last_error.startswith("JobTimeout" if end == "timeout" else "JobCancelled"), job.last_error
    assert job.metadata == {"tenant": 3, "stage": "stalled"}
    progress = rws.get_progress(job_id)
    assert progress is not None and (progress.current, progress.total, progress.message) == (3, 4, "step 3")


# -- django.tasks ----------------------------------------------------------------------------------


def test_a_tasks_result_keeps_its_metadata():
    from tests.testapp.tasks import tagged

    result = tagged.using(metadata={"tenant": 3}).enqueue()
    assert result.metadata == {"tenant": 3}
    assert Job.objects.get(id=result.id).metadata == {"tenant": 3}
    assert rws.tick()
    result.refresh()
    assert result.return_value == {"tenant": 3}  # what context.metadata read
    assert tagged.get_result(result.id).metadata == {"tenant": 3, "seen": True}


def test_a_failed_tasks_attempt_keeps_its_last_progress():
    """A task's attempt that fails writes its last report at its end, as a job's does
    (run.execute, the row runner's ``failed``)."""
    from tests.testapp.tasks import report_then_fail

    result = report_then_fail.enqueue(3)
    assert rws.tick()
    assert Job.objects.get(id=result.id).status == Status.FAILED
    progress = rws.get_progress(result.id)
    assert progress is not None and (progress.current, progress.total, progress.message) == (3, 4, "step 3")


def test_a_failed_tasks_row_keeps_its_saved_metadata():
    from tests.testapp.tasks import tagged

    result = tagged.using(metadata={"tenant": 4}).with_options(max_attempts=1).enqueue(fail=True)
    assert rws.tick()
    assert tagged.get_result(result.id).metadata == {"tenant": 4, "seen": True}
    assert Job.objects.get(id=result.id).metadata == {"tenant": 4, "seen": True}


def test_a_tasks_bad_metadata_is_invalid():
    from django_rws_jobs.tasks.compat import InvalidTask
    from tests.testapp.tasks import tagged

    with pytest.raises(InvalidTask, match=r"^metadata must be a dict, got str 'x'$"):
        tagged.using(metadata="x")


def test_metadata_read_and_left_unchanged_is_not_written_again(monkeypatch):
    """PostgreSQL gives jsonb back with its own spacing and key order: still unchanged."""
    statements = []
    monkeypatch.setattr(reports.Writer, "_execute", lambda self, sql, params: statements.append(sql))
    rws.enqueue("test.metadata", "a", metadata={"zeta": 1, "alpha": [1, {"b": 2, "a": 1}], "é": "ü"})
    rws.enqueue("test.metadata", "b")
    assert rws.tick() and rws.tick()
    assert [json.loads(t)[1] for t in traced("metadata")] == [
        {"zeta": 1, "alpha": [1, {"b": 2, "a": 1}], "é": "ü"},
        {},
    ]
    assert statements == []


def test_an_async_handler_reports_and_saves():
    job_id = rws.enqueue("test.report_async", metadata={"n": 1})
    assert rws.tick()
    assert traced("saved") == ["true"]
    row = Job.objects.get(id=job_id)
    assert row.metadata == {"n": 1, "async": True}
    assert rws.get_progress(job_id).message == "half"


def test_a_failed_attempt_keeps_its_last_progress():
    """Written at the attempt's end, not left to the writer's next round (which the outcome would
    beat): the row shows where the attempt stopped."""
    for n in range(5):
        job_id = rws.enqueue("test.report", json.dumps({"steps": 3, "total": 4, "fail": True}))
        assert rws.tick()
        progress = rws.get_progress(job_id)
        assert (progress.current, progress.total, progress.message) == (3, 4, "step 3"), n


def test_a_failed_attempts_last_progress_stays_when_the_writer_takes_it_at_the_end(tmp_path, monkeypatch):
    """The writer has taken the report (it is no longer queued) but not written it yet when the
    handler fails: the attempt's end waits for that write, so the failure, recorded after, does
    not beat it to the row (context.JobContext._end)."""
    taken, release = threading.Event(), threading.Event()
    write = reports.Writer._write

    def held(self, jobs, saves):
        if jobs and not taken.is_set():
            taken.set()
            release.wait(10)
        return write(self, jobs, saves)

    monkeypatch.setattr(reports.Writer, "_write", held)
    # The writer's first round waits INTERVAL: it takes the report after all three steps.
    monkeypatch.setattr(reports.writer(connection.alias), "last_write", time.monotonic())
    flag = tmp_path / "go"
    payload = {"steps": 3, "total": 4, "fail": True, "flags": [str(flag), None]}
    job_id = rws.enqueue("test.report", json.dumps(payload))
    ticked: list[bool] = []

    def tick() -> None:
        try:
            ticked.append(rws.tick())
        finally:
            connections.close_all()

    thread = threading.Thread(target=tick)
    thread.start()
    try:
        assert taken.wait(10), "the writer never took the report"
        flag.write_text("")
        # The handler fails now; its attempt's end must not record the failure before the write.
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and Job.objects.get(id=job_id).status == Status.RUNNING:
            time.sleep(0.02)
        assert Job.objects.get(id=job_id).status == Status.RUNNING, "the failure beat the taken report"
    finally:
        release.set()
        thread.join(30)
    assert ticked == [True]
    progress = rws.get_progress(job_id)
    assert (progress.current, progress.total, progress.message) == (3, 4, "step 3")
    assert Job.objects.get(id=job_id).status == Status.FAILED
