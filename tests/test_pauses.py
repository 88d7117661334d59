"""Pausing queues (django_rws_jobs/flow/pauses.py): the API, tick(), rws_queues, and real workers."""

import io
import time

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction

import django_rws_jobs as rws
from django_rws_jobs.flow.pauses import QueueFilter, pending_queues
from django_rws_jobs.models import Job, Queue
from django_rws_jobs.queue.store import Store
from tests.features import db_feature
from tests.test_worker import WorkerProcess, run_counts, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_pause_and_resume_are_stored_and_idempotent():
    assert rws.paused_queues() == []
    rws.pause_queue("mail")
    rws.pause_queue("mail")
    rws.pause_queue("alpha")
    assert rws.paused_queues() == ["alpha", "mail"]
    assert Queue.objects.get(name="mail").paused_at is not None
    rws.resume_queue("mail")
    rws.resume_queue("mail")
    rws.resume_queue("never-paused")  # nothing to resume: no row is made
    assert rws.paused_queues() == ["alpha"]
    assert not Queue.objects.filter(name="never-paused").exists()


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "queue name must not be empty"),
        ("a,b", "contains a comma"),
        ("x" * 65, "is 65 characters; the limit is 64"),
        (3, "queue name must be a str, got int 3"),
    ],
)
def test_a_queue_name_no_worker_could_serve_is_refused(name, message):
    for change in (rws.pause_queue, rws.resume_queue):
        with pytest.raises((ValueError, TypeError), match=message):
            change(name)
    assert not Queue.objects.exists()


def test_a_pause_inside_a_transaction_that_rolls_back_is_not_kept():
    with pytest.raises(RuntimeError), transaction.atomic():
        rws.pause_queue("mail")
        assert rws.paused_queues() == ["mail"]
        raise RuntimeError
    assert rws.paused_queues() == []


def test_tick_claims_nothing_from_a_paused_queue():
    rws.enqueue("test.record", "mail", queue="mail")
    rws.pause_queue("mail")
    assert rws.tick(queues=["mail"]) is False
    assert rws.tick() is False  # every queue: the only due job is paused
    rws.enqueue("test.record", "default")
    assert rws.tick() is True
    assert run_counts() == {"default": 1}
    assert rws.tick() is False
    rws.resume_queue("mail")
    assert rws.tick() is True
    assert run_counts() == {"default": 1, "mail": 1}


def test_a_worker_of_every_queue_claims_from_the_unpaused_ones_with_pending_jobs():
    for q in ("b", "a", "c", "a"):
        rws.enqueue("test.record", q, queue=q)
    store = Store(connection)
    with store.cursor() as c:
        assert pending_queues(c) == ["a", "b", "c"]
    serving = QueueFilter(None)
    assert serving.current(store) is None  # nothing paused: the claim has no queue filter
    rws.pause_queue("b")
    assert serving.current(store) is None  # read at most REFRESH apart
    serving.recheck = True
    assert serving.current(store) == ["a", "c"]
    own = QueueFilter(["b"])
    assert own.current(store) == []
    rws.resume_queue("b")
    own.recheck = True
    assert own.current(store) == ["b"]


def test_rws_queues_lists_pauses_and_resumes():
    rws.enqueue("test.record", "1", queue="mail")
    rws.enqueue("test.record", "2", queue="mail", run_in=3600)
    rws.enqueue("test.record", "3")
    rws.pause_queue("empty")
    out = io.StringIO()
    call_command("rws_queues", "pause", "mail", stdout=out)
    assert out.getvalue() == "paused mail\n"
    assert rws.paused_queues() == ["empty", "mail"]
    out = io.StringIO()
    call_command("rws_queues", "list", stdout=out)
    assert out.getvalue().splitlines() == [
        "QUEUE    STATE   LIMITS  WAITING  DUE  LATER  RUNNING  FAILED",
        "default  active  -       0        1    0      0        0",
        "empty    paused  -       0        0    0      0        0",
        "mail     paused  -       0        1    1      0        0",
    ]
    call_command("rws_queues", "resume", "mail", "empty", stdout=io.StringIO())
    assert rws.paused_queues() == []
    with pytest.raises(CommandError, match="contains a comma"):
        call_command("rws_queues", "pause", "a,b")


def test_rws_queues_alone_lists_the_queues():
    rws.enqueue("test.record", "1", queue="mail")
    alone, listed = io.StringIO(), io.StringIO()
    call_command("rws_queues", stdout=alone)
    call_command("rws_queues", "list", stdout=listed)
    assert alone.getvalue() == listed.getvalue()
    assert alone.getvalue().splitlines()[1].split() == ["mail", "active", "-", "0", "1", "0", "0", "0"]


def test_rws_queues_lists_limits_and_jobs_waiting_for_their_key(settings):
    queues = {"api": {"concurrency": 3, "rate_limit": "20/s"}, "slow": {"rate_limit": "5/h"}}
    settings.RWS_JOBS = {**settings.RWS_JOBS, "QUEUES": queues}
    rws.enqueue("test.keyed", "1", concurrency_key="k")  # pending: the key's slot was free
    rws.enqueue("test.keyed", "2", concurrency_key="k", queue="api")
    out = io.StringIO()
    call_command("rws_queues", "list", stdout=out)
    assert out.getvalue().splitlines() == [
        "QUEUE    STATE   LIMITS           WAITING  DUE  LATER  RUNNING  FAILED",
        "api      active  3 at once, 20/s  1        0    0      0        0",
        "default  active  -                0        1    0      0        0",
        "slow     active  5/h              0        0    0      0        0",
    ]


def test_rws_queues_list_says_when_there_is_no_queue():
    out = io.StringIO()
    call_command("rws_queues", "list", stdout=out)
    assert "No queues" in out.getvalue()


@pytest.mark.slow
def test_a_paused_queue_starts_nothing_while_others_run(tmp_path, started):
    jobs = {"POLL_INTERVAL": 0.2}
    w = WorkerProcess(tmp_path, "--workers", "2", jobs=jobs)
    started.append(w)
    w.started()
    rws.enqueue("test.record", "warm-up", queue="mail")
    wait_for(lambda: run_counts() == {"warm-up": 1}, 30, what=f"the first job:\n{w.output()}")
    rws.pause_queue("mail")
    time.sleep(1.5)  # the worker reads the pauses at most a second apart
    paused_at = time.monotonic()
    for i in range(5):
        rws.enqueue("test.record", f"mail-{i}", queue="mail")
    deadline = paused_at + 5
    i = 0
    while time.monotonic() < deadline:  # other queues run meanwhile; the paused one starts nothing
        rws.enqueue("test.record", f"other-{i}", queue="other")
        i += 1
        wait_for(lambda n=i: sum(k.startswith("other") for k in run_counts()) == n, 10, what=w.output())
        assert not any(k.startswith("mail-") for k in run_counts()), w.output()
        time.sleep(0.2)
    assert Job.objects.filter(queue="mail").count() == 5

    # Paused across a restart: a new worker starts nothing of it either.
    w.signal(15)
    assert w.wait() == 0
    w2 = WorkerProcess(tmp_path, "--workers", "2", jobs=jobs)
    started.append(w2)
    w2.started()
    rws.enqueue("test.record", "after-restart", queue="other")
    wait_for(lambda: "after-restart" in run_counts(), 30, what=w2.output())
    time.sleep(1.0)
    assert not any(k.startswith("mail-") for k in run_counts()), w2.output()

    resumed_at = time.monotonic()
    rws.resume_queue("mail")
    wait_for(lambda: sum(k.startswith("mail-") for k in run_counts()) == 5, 10, what=w2.output())
    # Within the poll interval (0.2 s) on every database, plus the five jobs' run: not the up to
    # a second a worker waits between two reads of the pauses when nothing wakes it.
    assert time.monotonic() - resumed_at < 1.0, w2.output()
    assert set(run_counts().values()) == {1}


@pytest.mark.slow
def test_burst_exits_when_only_paused_queues_have_due_jobs(tmp_path, started):
    rws.enqueue("test.record", "mail", queue="mail")
    rws.enqueue("test.record", "default")
    rws.pause_queue("mail")
    w = WorkerProcess(tmp_path, "--burst", jobs={"POLL_INTERVAL": 0.2})
    started.append(w)
    assert w.wait(60) == 0, w.output()
    assert run_counts() == {"default": 1}
    assert Job.objects.filter(queue="mail", status="pending").count() == 1


@pytest.mark.slow
@pytest.mark.skipif(db_feature("wakeup") == "poll", reason="needs a wake-up (NOTIFY, PRAGMA data_version)")
def test_a_resume_wakes_an_idle_worker_at_once(tmp_path, started):
    """PostgreSQL: resume_queue's NOTIFY; SQLite: the commit the worker's data_version sees. A
    poll interval far longer than the bound shows the wake-up, not the poll, started the job."""
    rws.pause_queue("mail")
    w = WorkerProcess(tmp_path, jobs={"POLL_INTERVAL": 5})
    started.append(w)
    w.started()
    rws.enqueue("test.record", "mail", queue="mail")
    time.sleep(2)
    assert run_counts() == {}
    resumed_at = time.monotonic()
    rws.resume_queue("mail")
    wait_for(lambda: run_counts() == {"mail": 1}, 10, what=w.output())
    assert time.monotonic() - resumed_at < 1.0, w.output()
