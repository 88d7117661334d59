"""Cancelling jobs: cancel(), what ends a held job whose cancel was requested, pruning, the
admin's action, and real workers stopping running handlers (thread and process pools)."""

import logging
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import Permission
from django.db import OperationalError, connection, connections
from django.urls import reverse

import django_rws_jobs as rws
import tests.cancel_handlers  # noqa: F401  (registers the handlers of the tick() tests)
from django_rws_jobs.api.cancellation import prune_cancelled
from django_rws_jobs.attempts.outcomes import WORKER_LOST, record, recover
from django_rws_jobs.attempts.run import AsyncRun, Watch, execute, watch
from django_rws_jobs.flow.concurrency_keys import SLOTS, KeySweep
from django_rws_jobs.models import Job
from django_rws_jobs.queue.store import Store
from django_rws_jobs.signals import job_cancelled
from django_rws_jobs.worker.executor import Executor
from django_rws_jobs.worker.timeouts import async_raise
from tests.cancel_handlers import hold_after_return
from tests.test_worker import WorkerProcess, wait_for
from tests.testapp.models import Run

try:
    from tests.testapp.tasks import _trace, task
except ImportError:  # no django.tasks: the tests of tasks skip
    task = None

pytestmark = pytest.mark.django_db(transaction=True)

T = 2_000_000_000


@pytest.fixture
def cancelled_signals():
    got = []

    def receiver(sender, job, **kwargs):
        got.append((job.id, job.status))

    job_cancelled.connect(receiver)
    yield got
    job_cancelled.disconnect(receiver)


def claim(store, n=10, token="w#1", now=T):
    return store.claim(token, now, now + 60, None, n)


def test_a_pending_job_is_cancelled_at_once_and_never_runs(cancelled_signals):
    job_id = rws.enqueue("test.record", "never", unique="u1")
    assert rws.cancel(job_id, by="ops")
    job = Job.objects.get(id=job_id)
    assert (job.status, job.cancelled_by, job.cancelled_at is not None) == ("cancelled", "ops", True)
    assert job.last_error == "JobCancelled: cancelled by ops before it ran"
    assert cancelled_signals == [(job_id, "cancelled")]
    assert not rws.tick()  # nothing to claim
    assert not Run.objects.exists()
    assert rws.enqueue("test.record", "again", unique="u1") != job_id  # its unique key is free
    assert not rws.cancel(job_id)  # no longer pending or running
    assert not rws.cancel("no-such-job")
    with pytest.raises(TypeError, match="job id must be a str, got int 5"):
        rws.cancel(5)


def test_cancelling_a_waiting_keyed_job_and_a_slot_holder_promotes_the_next():
    first, second = (rws.enqueue("test.keyed", str(i), concurrency_key="k") for i in range(2))
    KeySweep().sweep(Store(connection), int(time.time()))
    assert Job.objects.get(id=first).concurrency_slot == 0
    assert rws.cancel(first)  # it held the key's slot: the next job gets it
    assert Job.objects.get(id=first).concurrency_slot is None
    assert (Job.objects.get(id=second).status, Job.objects.get(id=second).concurrency_slot) == ("pending", 0)


def test_a_cancelled_job_can_be_retried_and_runs_or_deleted():
    job_id = rws.enqueue("test.record", "later")
    rws.cancel(job_id)
    assert [j.id for j in rws.jobs(status="cancelled")] == [job_id]
    assert rws.retry(job_id)
    job = Job.objects.get(id=job_id)
    assert (job.status, job.cancelled_at, job.cancelled_by) == ("pending", None, None)
    assert rws.tick() and Run.objects.filter(payload="later").exists()
    other = rws.enqueue("test.record", "x")
    rws.cancel(other)
    assert rws.delete(other) and not Job.objects.filter(id=other).exists()


def test_a_held_job_with_a_request_ends_cancelled_however_its_claim_ends(cancelled_signals, caplog):
    """The request reaches the row while a worker holds the job: a failure, a hand-back and
    recovery of its lease each write cancelled, never a retry; a success stays done. The log
    says how each ended."""
    store = Store(connection)
    ids = [rws.enqueue("test.record", str(i)) for i in range(4)]
    jobs = {j.id: j for j in claim(store)}
    for job_id in ids:
        assert rws.cancel(job_id)  # running: asked, still running
    assert set(Job.objects.values_list("status", flat=True)) == {"running"}
    assert record(store, jobs[ids[0]], "ValueError: boom", None) == "cancelled"
    assert not store.release(jobs[ids[1]])
    assert record(store, jobs[ids[1]], "JobCancelled: cancelled while it ran", None) == "cancelled"
    assert record(store, jobs[ids[2]], None, None) == "done"  # it finished first: done
    with caplog.at_level(logging.WARNING, logger="django_rws_jobs"):
        assert recover(store, now=T + 61) == 1  # its worker died: taken back as cancelled
    assert f"job {ids[3]} (test.record) cancelled when its lease expired (its worker was lost)" in caplog.text
    rows = dict(Job.objects.values_list("id", "status"))
    assert rows == {ids[0]: "cancelled", ids[1]: "cancelled", ids[3]: "cancelled"}
    assert Job.objects.get(id=ids[3]).last_error.startswith("JobCancelled")
    assert sorted(cancelled_signals) == sorted((i, "cancelled") for i in (ids[0], ids[1], ids[3]))
    assert record(store, jobs[ids[3]], WORKER_LOST, None) == "lost"  # fenced: that claim is gone


def test_cancelled_jobs_are_pruned_after_their_retention():
    store = Store(connection)
    old, new = rws.enqueue("test.record", "a"), rws.enqueue("test.record", "b")
    rws.cancel(old)
    rws.cancel(new)
    Job.objects.filter(id=old).update(cancelled_at=T - 100)
    Job.objects.filter(id=new).update(cancelled_at=T - 10)
    assert prune_cancelled(store, T, 50) == 1
    assert list(Job.objects.values_list("id", flat=True)) == [new]


def test_a_cancelled_tasks_result_reads_failed_with_job_cancelled():
    tasks = pytest.importorskip("tests.testapp.tasks")
    compat = pytest.importorskip("django_rws_jobs.tasks.compat")
    result = tasks.record.enqueue("x")
    assert rws.cancel(result.id)
    got = tasks.record.get_result(result.id)
    assert got.status == compat.TaskResultStatus.FAILED
    assert got.errors[-1].exception_class_path == "django_rws_jobs.exceptions.JobCancelled"


def test_the_jobs_list_cancels_the_selected_jobs_with_its_permission(client, django_user_model):
    staff = django_user_model.objects.create_user("ops", password="pw", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_job"))
    client.force_login(staff)
    ids = [rws.enqueue("test.record", str(i)) for i in range(3)]
    url = reverse("admin:django_rws_jobs_job_changelist")
    post = {"action": "cancel_selected", "_selected_action": ids[:2]}
    assert "cancel_selected" not in client.get(url).content.decode()  # no permission: no action
    client.post(url, post)
    assert set(Job.objects.values_list("status", flat=True)) == {"pending"}
    staff.user_permissions.add(Permission.objects.get(codename="cancel_job"))
    assert "cancel_selected" in client.get(url).content.decode()
    response = client.post(url, post, follow=True)
    assert "Cancelled 2 jobs." in response.content.decode()
    rows = dict(Job.objects.values_list("id", "status"))
    assert rows == {ids[0]: "cancelled", ids[1]: "cancelled", ids[2]: "pending"}
    assert Job.objects.get(id=ids[0]).cancelled_by == "admin:ops"
    page = client.get(reverse("admin:django_rws_jobs_job_change", args=[ids[0]])).content.decode()
    assert "admin:ops" in page


# -- what decides a cancel ---------------------------------------------------------------------------


def test_an_error_named_job_cancelled_without_a_request_is_an_ordinary_failure():
    """An application's own ``JobCancelled(Exception)``, and ours raised by a handler that nobody
    asked to stop, are failures: retried, not left running until their lease expires."""
    apps = rws.enqueue("cancel.apps_own_error", "mine", max_retries=1)
    ours = rws.enqueue("cancel.raises_ours", "by hand", max_retries=1)
    assert rws.tick()
    with pytest.raises(rws.JobCancelled):  # a BaseException: recorded, then raised as SystemExit is
        rws.tick()
    got = {j.id: (j.status, j.attempts, j.last_error) for j in Job.objects.all()}
    assert got == {apps: ("pending", 1, "JobCancelled: mine"), ours: ("pending", 1, "JobCancelled: by hand")}


def test_a_cancel_request_frees_the_unique_key_of_a_running_job(cancelled_signals):
    """The next enqueue of the key makes a new job, which runs; the cancelled one ends cancelled."""
    store = Store(connection)
    old = rws.enqueue("test.record", "old", unique="report:7")
    [held] = claim(store)
    assert rws.cancel(old)  # running: asked
    assert Job.objects.get(id=old).unique_hash is None
    new = rws.enqueue("test.record", "new", unique="report:7")
    assert new != old
    assert rws.enqueue("test.record", "again", unique="report:7") == new  # the key is the new job's
    assert record(store, held, "ValueError: stopped", None) == "cancelled"
    assert cancelled_signals == [(old, "cancelled")]
    assert not rws.retry(old)  # the new job holds the key
    assert rws.tick() and not rws.tick()
    assert list(Run.objects.values_list("payload", flat=True)) == ["new"]
    assert list(Job.objects.values_list("id", "status")) == [(old, "cancelled")]


def test_a_cancel_request_frees_the_key_of_a_running_unique_task():
    tasks = pytest.importorskip("tests.testapp.tasks")
    store = Store(connection)
    old = tasks.unique.enqueue("k")
    [held] = claim(store)
    assert held.id == old.id and rws.cancel(old.id)
    new = tasks.unique.enqueue("k")
    assert new.id != old.id and tasks.unique.enqueue("k").id == new.id


def test_a_request_a_rust_retry_kept_is_carried_out_before_the_handler_runs(cancelled_signals, caplog):
    """A rust-web-server worker claims the job, its cancel is requested (which the crate does not
    know), and the crate retries it: our next claim ends it cancelled without running it, and
    the log says so."""
    job_id = rust_retried_after_a_cancel_request()
    with caplog.at_level(logging.WARNING, logger="django_rws_jobs"):
        assert rws.tick()
    assert f"job {job_id} (test.record) cancelled before its handler ran" in caplog.text
    assert "while it ran" not in caplog.text
    job = Job.objects.get(id=job_id)
    assert (job.status, job.attempts, job.cancelled_by) == ("cancelled", 1, "ops")
    assert job.last_error == "JobCancelled: cancelled before it ran"
    assert not Run.objects.exists()
    assert cancelled_signals == [(job_id, "cancelled")]


def test_a_request_a_rust_start_up_reset_kept_is_carried_out_before_the_handler_runs(cancelled_signals):
    """The crate's start-up reset puts its running jobs back with no attempt added: the claim
    brings the request along all the same, and the job ends cancelled without running."""
    job_id = rust_reset_after_a_cancel_request()
    assert rws.tick()
    job = Job.objects.get(id=job_id)
    assert (job.status, job.attempts, job.cancelled_by) == ("cancelled", 0, "ops")
    assert job.last_error == "JobCancelled: cancelled before it ran"
    assert not Run.objects.exists()
    assert cancelled_signals == [(job_id, "cancelled")]


def rust_reset_after_a_cancel_request():
    """A job as the crate leaves it when it starts again: claimed by its exact SQL, cancel
    requested meanwhile, then reset to pending by its start-up's exact SQL (no attempt added)."""
    job_id = rws.enqueue("test.record", "rust", max_retries=3)
    with connection.cursor() as c:
        c.execute("UPDATE rws_jobs SET status = 'running' WHERE id = %s AND status = 'pending'", [job_id])
        assert rws.cancel(job_id, by="ops")  # running: asked
        c.execute("UPDATE rws_jobs SET status = 'pending' WHERE status = 'running'")
    return job_id


def rust_retried_after_a_cancel_request():
    """A job as the crate leaves it: claimed by its exact SQL, cancel requested meanwhile, then
    retried by its exact SQL (attempts + 1, pending, due now)."""
    job_id = rws.enqueue("test.record", "rust", max_retries=3)
    with connection.cursor() as c:
        c.execute("UPDATE rws_jobs SET status = 'running' WHERE id = %s AND status = 'pending'", [job_id])
        assert rws.cancel(job_id, by="ops")  # running: asked
        c.execute(
            "UPDATE rws_jobs SET status = 'pending', attempts = %s, last_error = %s, next_run_at = %s "
            "WHERE id = %s",
            [1, "rust: boom", int(time.time()), job_id],
        )
    return job_id


def test_a_cancel_whose_promotion_fails_still_returns_true_and_signals(cancelled_signals, caplog):
    """The cancel committed before the freed slot's promotion runs: a failing promotion is logged
    and left to the workers' key sweep."""
    first, second = (rws.enqueue("test.keyed", str(i), concurrency_key="k") for i in range(2))
    KeySweep().sweep(Store(connection), int(time.time()))
    assert Job.objects.get(id=first).concurrency_slot == 0

    def refuse_promotion(execute, sql, params, many, context):
        if sql == SLOTS:
            raise OperationalError("promotion refused")
        return execute(sql, params, many, context)

    with (
        caplog.at_level(logging.ERROR, logger="django_rws_jobs"),
        connection.execute_wrapper(refuse_promotion),
    ):
        assert rws.cancel(first)
    assert cancelled_signals == [(first, "cancelled")]
    assert Job.objects.get(id=first).status == "cancelled"
    assert "promotion refused" in caplog.text
    assert Job.objects.get(id=second).status == "waiting"
    KeySweep().sweep(Store(connection), int(time.time()))  # what a worker's sweep does
    assert (Job.objects.get(id=second).status, Job.objects.get(id=second).concurrency_slot) == ("pending", 0)


def test_a_job_run_inside_a_handler_does_not_mark_the_outer_handler_returned():
    """An executor's Watch of its job says "returned" only for that job: a job that its handler
    runs by tick() leaves it alone, so a cancel of the outer job still stops its handler."""
    store = Store(connection)
    outer, inner = (rws.enqueue("test.record", p) for p in ("outer", "inner"))
    jobs = {j.id: j for j in claim(store)}
    handlers = Watch()
    watch(handlers)
    try:
        handlers.start(jobs[outer])
        assert execute(jobs[inner]) == (None, None)
        assert handlers.outcome is None
        assert execute(jobs[outer]) == (None, None)
        assert handlers.outcome == (None, None)
    finally:
        watch(None)


# -- real workers ------------------------------------------------------------------------------------

FAST = {"POLL_INTERVAL": 0.1, "BACKOFF_INITIAL": 0.1, "TIMEOUT_GRACE": 1}


def wait_started(payload, kind="start"):
    wait_for(lambda: Run.objects.filter(kind=kind, payload=payload).exists(), 30, what=f"{payload} to {kind}")


@pytest.mark.slow
@pytest.mark.parametrize(
    "pool, job_type, payload, kind",
    [("threads", "test.spin", "loop", "spin"), ("processes", "test.sleep", "600", "start")],
)
def test_cancelling_a_running_job_stops_its_handler(tmp_path, started, pool, job_type, payload, kind):
    """A handler looping in Python (thread pool) and one in time.sleep(600) (process pool) stop
    within 2 s of the request, end cancelled and are not retried."""
    w = WorkerProcess(tmp_path, "--workers", "2", "--pool", pool, jobs=FAST)
    started.append(w)
    job_id = rws.enqueue(job_type, payload, max_retries=3)
    wait_started(payload, kind)
    time.sleep(0.7)  # well into its run
    asked = time.monotonic()
    assert rws.cancel(job_id, by="test")
    wait_for(lambda: Job.objects.get(id=job_id).status == "cancelled", 10, what=w.output())
    assert time.monotonic() - asked < 2.0, w.output()
    job = Job.objects.get(id=job_id)
    assert job.attempts == 0 and job.last_error.startswith("JobCancelled"), job.last_error
    time.sleep(1)
    assert Run.objects.filter(kind=kind, payload=payload).count() == 1  # not run again
    rws.enqueue("test.record", "after")  # the worker goes on
    wait_for(lambda: Run.objects.filter(payload="after").exists(), 10, what=w.output())
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0, w.output()


@pytest.mark.slow
def test_a_handler_that_finishes_before_the_request_reaches_it_stays_done(tmp_path, started):
    w = WorkerProcess(tmp_path, jobs=FAST)
    started.append(w)
    job_id = rws.enqueue("test.sleep", "0.3")
    wait_started("0.3")
    assert rws.cancel(job_id)  # running: asked
    wait_for(lambda: not Job.objects.filter(id=job_id).exists(), 10, what=w.output())  # done, deleted
    assert Run.objects.filter(kind="end", payload="0.3").exists()


@pytest.mark.slow
def test_a_cancel_racing_a_lease_take_over_ends_the_job_once(tmp_path, started):
    """The holder is paused (SIGSTOP) past its lease; a second worker takes the job back while a
    cancel is requested: the job ends cancelled, never runs again, and the paused holder's late
    result is dropped when it resumes."""
    lease = {**FAST, "LEASE_SECONDS": 2, "RECOVERY_INTERVAL": 0.3}
    holder = WorkerProcess(tmp_path, jobs=lease)
    started.append(holder)
    job_id = rws.enqueue("test.sleep", "3", max_retries=5)
    wait_started("3")
    holder.signal(signal.SIGSTOP)
    try:
        assert rws.cancel(job_id, by="race")
        rescuer = WorkerProcess(tmp_path, jobs=lease)
        started.append(rescuer)
        wait_for(lambda: Job.objects.get(id=job_id).status == "cancelled", 20, what=rescuer.output())
    finally:
        holder.signal(signal.SIGCONT)
    time.sleep(4)  # the holder's handler ends; its outcome is fenced out
    job = Job.objects.get(id=job_id)
    assert (job.status, job.cancelled_by, job.attempts) == ("cancelled", "race", 0)
    assert Run.objects.filter(kind="start", payload="3").count() == 1
    assert "dropped" in holder.output()


#: Worker processes that know tests/cancel_handlers.py's handlers.
CANCEL_HANDLERS = {"DJANGO_SETTINGS_MODULE": "tests.settings_cancel"}


@pytest.mark.slow
@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_a_worker_records_an_unasked_job_cancelled_error_as_a_failure(tmp_path, started, pool):
    """Each pool: the dead-letter list at once (no retries left), not running until the lease ends."""
    w = WorkerProcess(tmp_path, "--pool", pool, jobs=FAST, env=CANCEL_HANDLERS)
    started.append(w)
    apps = rws.enqueue("cancel.apps_own_error", "mine", max_retries=0)
    ours = rws.enqueue("cancel.raises_ours", "by hand", max_retries=0)
    wait_for(lambda: Job.objects.filter(status="failed").count() == 2, 20, what=w.output())
    got = {j.id: (j.status, j.attempts, j.last_error) for j in Job.objects.all()}
    assert got == {apps: ("failed", 1, "JobCancelled: mine"), ours: ("failed", 1, "JobCancelled: by hand")}


@pytest.mark.slow
@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_a_cancel_that_reaches_a_handler_after_it_returned_leaves_it_done(tmp_path, started, pool):
    """The handler has returned and the worker's clean-up is held (tests/cancel_handlers.py) when
    the watcher acts on the request: the thread pool does not raise JobCancelled in the clean-up,
    the process pool's child answers before it obeys the SIGTERM. The job is done."""
    w = WorkerProcess(
        tmp_path,
        "--pool",
        pool,
        jobs={**FAST, "TIMEOUT_GRACE": 60},  # no SIGKILL while the child finishes
        env={**CANCEL_HANDLERS, "RWS_LOG_LEVEL": "INFO"},
    )
    started.append(w)
    job_id = rws.enqueue("cancel.linger_after_return", str(tmp_path))
    wait_for(lambda: (tmp_path / "returned").exists(), 30, what=w.output())
    assert rws.cancel(job_id)
    acted = f"job {job_id} (cancel.linger_after_return): cancel requested"
    wait_for(lambda: acted in w.output(), 10, what=w.output())
    (tmp_path / "go").touch()
    wait_for(lambda: not Job.objects.filter(id=job_id, status="running").exists(), 20, what=w.output())
    assert list(Job.objects.values_list("status", "last_error")) == [], w.output()
    assert Run.objects.filter(kind="done").count() == 1


@pytest.mark.slow
@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_a_cancel_that_reaches_an_async_handler_after_it_returned_leaves_it_done(tmp_path, started, pool):
    """As for a plain handler: the coroutine has returned and its event loop's thread is held
    when the watcher acts on the request. The thread pool does not stop it (the executor's thread
    waits for the loop), the process pool's child defers the SIGTERM: the job is done."""
    w = WorkerProcess(
        tmp_path,
        "--pool",
        pool,
        jobs={**FAST, "TIMEOUT_GRACE": 60},
        env={**CANCEL_HANDLERS, "RWS_LOG_LEVEL": "INFO"},
    )
    started.append(w)
    job_id = rws.enqueue("cancel.async_linger_after_return", str(tmp_path))
    wait_for(lambda: (tmp_path / "returned").exists(), 30, what=w.output())
    assert rws.cancel(job_id)
    acted = f"job {job_id} (cancel.async_linger_after_return): cancel requested"
    wait_for(lambda: acted in w.output(), 10, what=w.output())
    (tmp_path / "go").touch()
    wait_for(lambda: not Job.objects.filter(id=job_id, status="running").exists(), 20, what=w.output())
    assert list(Job.objects.values_list("status", "last_error")) == [], w.output()


@pytest.mark.slow
def test_cancelling_a_running_async_handler_stops_it_at_its_await(tmp_path, started):
    """Thread pool: asyncio.CancelledError reaches the coroutine in its asyncio.sleep(600), the
    job ends cancelled, not retried, and the worker's one executor thread runs the next job."""
    w = WorkerProcess(tmp_path, "--workers", "1", jobs=FAST, env=CANCEL_HANDLERS)
    started.append(w)
    job_id = rws.enqueue("cancel.async_sleep", str(tmp_path), max_retries=3)
    wait_for(lambda: (tmp_path / "started").exists(), 30, what=w.output())
    assert rws.cancel(job_id, by="test")
    wait_for(lambda: Job.objects.get(id=job_id).status == "cancelled", 10, what=w.output())
    job = Job.objects.get(id=job_id)
    assert (job.attempts, job.cancelled_by) == (0, "test")
    assert job.last_error == "JobCancelled: cancelled while it ran", job.last_error
    assert "CancelledError" in job.traceback  # where the coroutine was stopped
    assert (tmp_path / "stopped").exists()
    rws.enqueue("test.record", "after")
    wait_for(lambda: Run.objects.filter(payload="after").exists(), 10, what=w.output())
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0, w.output()
    assert " 0 threads abandoned" in w.output()


@pytest.mark.slow
def test_cancelling_a_running_async_task_stops_it(tmp_path, started):
    """The same for an async def django.tasks task: its result reads FAILED with JobCancelled."""
    compat = pytest.importorskip("django_rws_jobs.tasks.compat")
    tasks = pytest.importorskip("tests.testapp.tasks")
    w = WorkerProcess(tmp_path, "--workers", "1", jobs=FAST)
    started.append(w)
    result = tasks.asleep.enqueue(600)
    wait_for(lambda: Job.objects.filter(id=result.id, status="running").exists(), 30, what=w.output())
    assert rws.cancel(result.id)
    wait_for(lambda: Job.objects.get(id=result.id).status == "cancelled", 10, what=w.output())
    got = tasks.asleep.get_result(result.id)
    assert got.status == compat.TaskResultStatus.FAILED
    assert got.errors[-1].exception_class_path == "django_rws_jobs.exceptions.JobCancelled"


def test_an_async_handler_stopped_before_its_coroutine_starts_does_not_run():
    """A stop that reaches an AsyncRun before its event loop starts the coroutine: the run raises
    the stop's exception at once and the handler's body never runs."""
    ran = []

    async def handler(payload):
        ran.append(payload)

    run = AsyncRun()
    run.stop(rws.JobCancelled("asked"))
    with pytest.raises(rws.JobCancelled, match="asked"):
        async_to_sync(run.run)(handler, ("x",), {}, None, None)
    assert ran == []


@pytest.mark.slow
@pytest.mark.parametrize("put_back, attempts", [("retried", 1), ("reset", 0)])
@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_a_worker_ends_a_rust_retried_cancel_request_without_running_it(
    tmp_path, started, pool, put_back, attempts
):
    """Whether the crate retried the job or reset it at its start."""
    put_back_by = {"retried": rust_retried_after_a_cancel_request, "reset": rust_reset_after_a_cancel_request}
    job_id = put_back_by[put_back]()
    w = WorkerProcess(tmp_path, "--pool", pool, jobs=FAST)
    started.append(w)
    wait_for(lambda: Job.objects.get(id=job_id).status == "cancelled", 20, what=w.output())
    assert Job.objects.get(id=job_id).attempts == attempts
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0, w.output()
    assert not Run.objects.exists()
    assert f"job {job_id} (test.record) cancelled before its handler ran" in w.output()


if task is not None:

    @task
    def outlive_the_cancel() -> str:
        """Catches the SystemExit of its cancel's SIGTERM (process pool) and returns."""
        _trace("task-start", "outlive")
        try:
            while True:
                time.sleep(0.02)
        except SystemExit:
            _trace("task-caught", "outlive")
        return "survived"


@pytest.mark.slow
def test_a_task_that_succeeds_after_its_cancels_sigterm_reads_successful(tmp_path, started):
    """The child answers a success for a job whose cancel's SIGTERM was sent, as when the task
    returns just before the signal; here it returns after catching the signal's SystemExit, so
    that the order is certain. The result is the success."""
    compat = pytest.importorskip("django_rws_jobs.tasks.compat")
    w = WorkerProcess(tmp_path, "--pool", "processes", jobs=FAST)
    started.append(w)
    result = outlive_the_cancel.enqueue()
    wait_started("outlive", "task-start")
    assert rws.cancel(result.id)
    wait_for(lambda: not Job.objects.filter(id=result.id, status="running").exists(), 20, what=w.output())
    got = outlive_the_cancel.get_result(result.id)
    assert got.status == compat.TaskResultStatus.SUCCESSFUL, (got.errors, w.output())
    assert got.return_value == "survived"
    assert Run.objects.filter(kind="task-caught").exists()


if task is not None:

    @task
    def linger_after_return_task(directory: str) -> str:
        """cancel.linger_after_return as a task: it returns ``"done"``, then holds the worker at
        the first Python call after its return, where the worker builds the task's result."""
        _trace("task-done", directory)
        sys.setprofile(hold_after_return(Path(directory)))
        return "done"


@pytest.mark.slow
@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_a_cancel_that_reaches_a_task_after_it_returned_leaves_it_successful(tmp_path, started, pool):
    """As for a handler: the task has returned and the worker is held where it builds the
    result when the watcher acts on the request. The result reads SUCCESSFUL, with the value."""
    compat = pytest.importorskip("django_rws_jobs.tasks.compat")
    w = WorkerProcess(
        tmp_path,
        "--pool",
        pool,
        jobs={**FAST, "TIMEOUT_GRACE": 60},  # no SIGKILL while the child finishes
        env={"RWS_LOG_LEVEL": "INFO"},
    )
    started.append(w)
    result = linger_after_return_task.enqueue(str(tmp_path))
    wait_for(lambda: (tmp_path / "returned").exists(), 30, what=w.output())
    assert rws.cancel(result.id)
    acted = f"job {result.id} (django.tasks:tests.test_cancel.linger_after_return_task): cancel requested"
    wait_for(lambda: acted in w.output(), 10, what=w.output())
    (tmp_path / "go").touch()
    wait_for(lambda: not Job.objects.filter(id=result.id, status="running").exists(), 20, what=w.output())
    got = linger_after_return_task.get_result(result.id)
    assert got.status == compat.TaskResultStatus.SUCCESSFUL, (got.errors, w.output())
    assert got.return_value == "done"
    assert not Job.objects.exists()


def test_a_cancel_raised_just_before_a_task_returned_leaves_it_successful(tmp_path):
    """The watcher found the task running and raised JobCancelled, which lands after the return,
    where the worker builds the result: the executor builds it again, and the task is done."""
    compat = pytest.importorskip("django_rws_jobs.tasks.compat")
    store = Store(connection)
    result = linger_after_return_task.enqueue(str(tmp_path))
    [job] = claim(store)
    assert rws.cancel(result.id)  # running: asked
    executor = Executor(shared=None)  # type: ignore[arg-type]  (execute needs none)
    got = []

    def run():
        watch(executor.handlers)
        try:
            got.append(executor.execute(job))
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    wait_for(lambda: (tmp_path / "returned").exists(), 10, what="the task to return")
    with executor.cancel_lock:  # what cancel() does when it finds the handler still running
        executor.cancel_raised = True
        async_raise(executor.ident, rws.JobCancelled)
    (tmp_path / "go").touch()
    thread.join(10)
    [(abandoned, outcome, tb)] = got
    assert record(store, job, outcome, tb) == "done"
    got = linger_after_return_task.get_result(result.id)
    assert (got.status, got.return_value) == (compat.TaskResultStatus.SUCCESSFUL, "done"), got.errors
