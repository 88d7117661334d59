"""Job time limits: which limit applies, bad values refused, and (real worker processes) a job that
runs past its limit fails with JobTimeout in the thread pool."""

import math
import signal
import time

import pytest
from django.core.checks import run_checks

import django_rws_jobs as rws
from django_rws_jobs import JobTimeout, job
from django_rws_jobs.models import Job
from django_rws_jobs.queue.registry import registry
from django_rws_jobs.queue.store import Claimed
from django_rws_jobs.worker.timeouts import timeout_for
from tests.test_worker import run_counts, wait_for, workers  # noqa: F401  (workers: a fixture)
from tests.testapp.models import Run

FAST = {"BACKOFF_INITIAL": 0.1, "TIMEOUT_GRACE": 1, "POLL_INTERVAL": 0.1}


def claimed(job_type: str, timeout: float | None = None) -> Claimed:
    return Claimed(
        "id", job_type, "", "default", 0, 0, 3, 0, 0, None, timeout, None, None, None, None, "token"
    )


def test_a_jobs_limit_is_its_own_then_its_types_then_the_setting(settings):
    settings.RWS_JOBS = {"TIMEOUT": 9}
    assert timeout_for(claimed("test.spin_limited", 2), 9) == 2.0  # its own wins
    assert timeout_for(claimed("test.spin_limited"), 9) == 0.5  # @job(timeout=0.5)
    assert timeout_for(claimed("test.unlimited"), 9) is None  # @job(timeout=None): no limit
    assert timeout_for(claimed("test.record"), 9) == 9  # the setting
    assert timeout_for(claimed("unregistered.type"), None) is None


@pytest.mark.django_db
def test_enqueue_stores_a_jobs_own_limit():
    job_id = rws.enqueue("test.record", "x", timeout=2.5)
    other = rws.enqueue("test.record", "y")
    ids = rws.enqueue_many([{"job_type": "test.record", "timeout": 3}, "test.record"])
    limits = dict(Job.objects.values_list("id", "timeout"))
    assert (limits[job_id], limits[other], limits[ids[0]], limits[ids[1]]) == (2.5, None, 3.0, None)
    assert {j.id: j.timeout for j in rws.jobs()}[job_id] == 2.5


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("value", "error", "words"),
    [
        (0, ValueError, "timeout 0 is out of range; it must be above 0 and at most 604800 s"),
        (-1, ValueError, "timeout -1 is out of range"),
        (math.nan, ValueError, "timeout nan is out of range"),
        (math.inf, ValueError, "timeout inf is out of range"),
        (604801, ValueError, "timeout 604801 is out of range; it must be above 0 and at most 604800 s"),
        ("5", TypeError, "timeout must be a number of seconds, got str '5'"),
        (True, TypeError, "timeout must be a number of seconds, got bool True"),
    ],
)
def test_bad_timeouts_are_refused_naming_the_value(value, error, words):
    with pytest.raises(error, match=words.replace("(", r"\(")):
        rws.enqueue("test.record", timeout=value)
    with pytest.raises(error, match="job #0: " + words.replace("(", r"\(")):
        rws.enqueue_many([{"job_type": "test.record", "timeout": value}])
    with pytest.raises(error, match="job_type 'tests.bad_timeout': " + words.replace("(", r"\(")):
        job("tests.bad_timeout", timeout=value)(lambda payload: None)
    assert "tests.bad_timeout" not in registry
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("key", "value", "check_id"),
    [
        ("TIMEOUT", 0, "rws_jobs.E015"),
        ("TIMEOUT", "60", "rws_jobs.E015"),
        ("TIMEOUT_GRACE", 0, "rws_jobs.E016"),
    ],
)
def test_bad_timeout_settings_have_their_checks(settings, key, value, check_id):
    settings.RWS_JOBS = {key: value}
    errors = [m for m in run_checks(tags=["rws_jobs"]) if m.id == check_id]
    assert len(errors) == 1 and f"RWS_JOBS['{key}'] is {value!r}" in errors[0].msg


def test_job_timeout_is_not_an_exception():
    # A handler's `except Exception` must not swallow it.
    assert issubclass(JobTimeout, BaseException) and not issubclass(JobTimeout, Exception)


def test_the_admin_shows_a_jobs_limit_and_the_overview_counts_timed_out_failures(admin_client, settings):
    from django.urls import reverse

    from tests.test_admin import OVERVIEW, make_job

    settings.RWS_JOBS = {"TIMEOUT": 30}
    make_job("own", timeout=2.5)
    make_job("typed", job_type="test.spin_limited")
    make_job("default")
    make_job("t1", status="failed", error="JobTimeout: ran longer than 1 s")
    make_job("t2", status="failed", error="JobTimeout: ran longer than 2 s", queue="mail")
    make_job("f1", status="failed", error="ValueError: JobTimeout: not one")
    shown = {}
    for job_id in ("own", "typed", "default"):
        page = admin_client.get(reverse("admin:django_rws_jobs_job_change", args=[job_id])).content.decode()
        shown[job_id] = page
    assert "2.5 s (this job&#x27;s own)" in shown["own"]
    assert "0.5 s (its job type&#x27;s)" in shown["typed"]
    assert "30 s (RWS_JOBS[&#x27;TIMEOUT&#x27;])" in shown["default"]
    response = admin_client.get(OVERVIEW)
    rows = {r["stats"].queue: r["stats"] for r in response.context["rows"]}
    assert (rows["default"].failed, rows["default"].timed_out, rows["mail"].timed_out) == (2, 1, 1)
    assert response.context["totals"]["timed_out"] == "2"
    assert "of them timed out" in response.content.decode()


# -- real worker processes, thread pool ---------------------------------------------------------


def failed(job_id: str) -> bool:
    return Job.objects.filter(id=job_id, status="failed").exists()


@pytest.mark.parametrize("pool", ["threads", "processes"])
@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_handler_that_runs_for_ever_fails_with_job_timeout_and_retries(workers, pool):  # noqa: F811
    stuck = rws.enqueue("test.spin", "stuck", timeout=1, max_retries=1)
    w = workers("--workers", "2", "--pool", pool, jobs=FAST)
    wait_for(lambda: Run.objects.filter(kind="spin").exists(), what="the stuck job to start")
    # One stuck job never delays the others: they run on the other executor meanwhile.
    t0 = time.monotonic()
    for i in range(5):
        rws.enqueue("test.record", str(i))
    wait_for(lambda: len(run_counts()) == 5, timeout=10, what="the other jobs")
    assert time.monotonic() - t0 < 3
    wait_for(lambda: failed(stuck), timeout=20, what="the stuck job to fail twice")
    job = Job.objects.get(id=stuck)
    assert (job.attempts, job.last_error) == (2, "JobTimeout: ran longer than 1 s")
    if pool == "threads":  # raised in the handler: where it stood is in the traceback
        assert "JobTimeout" in job.traceback and "_forever" in job.traceback
    assert Run.objects.filter(kind="spin").count() == 2  # the first attempt and its one retry
    w.signal(signal.SIGTERM)
    assert w.wait() == 0, w.output()
    assert "2 timed out" in w.output()


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_limits_from_the_setting_and_the_decorator_apply_and_catching_does_not_help(workers):  # noqa: F811
    from_setting = rws.enqueue("test.spin", "setting", max_retries=0)
    from_type = rws.enqueue("test.spin_limited", "type", max_retries=0)
    caught = rws.enqueue("test.catch_timeout", "caught", max_retries=0)
    unlimited = rws.enqueue("test.unlimited", "1.5", max_retries=0)
    w = workers("--workers", "4", jobs={**FAST, "TIMEOUT": 1})
    wait_for(lambda: all(map(failed, (from_setting, from_type, caught))), timeout=20, what="timeouts")
    errors = dict(Job.objects.values_list("id", "last_error"))
    assert errors[from_setting] == "JobTimeout: ran longer than 1 s"
    assert errors[from_type] == "JobTimeout: ran longer than 0.5 s"
    assert errors[caught] == "JobTimeout: ran longer than 1 s"
    assert run_counts("caught") == {"caught": 1}  # it caught JobTimeout, and failed all the same
    wait_for(lambda: run_counts("unlimited") == {"1.5": 1}, what="the job without a limit")
    # (its trace is written before it returns; its row goes when the completer records it)
    wait_for(lambda: not Job.objects.filter(id=unlimited).exists(), what="the job without a limit to succeed")
    w.signal(signal.SIGTERM)
    assert w.wait() == 0, w.output()


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_thread_stuck_in_a_blocking_call_is_abandoned_and_replaced(workers):  # noqa: F811
    stuck = rws.enqueue("test.block", "stuck", timeout=1, max_retries=0)
    w = workers("--workers", "1", jobs=FAST)
    wait_for(lambda: failed(stuck), timeout=10, what="the blocked job to fail")
    job = Job.objects.get(id=stuck)
    assert job.last_error == "JobTimeout: ran longer than 1 s" and job.locked_by is None
    rws.enqueue("test.record", "after")
    wait_for(lambda: run_counts() == {"after": 1}, timeout=10, what="a new thread to run the next job")
    t0 = time.monotonic()
    w.signal(signal.SIGTERM)
    assert w.wait() == 0, w.output()
    assert time.monotonic() - t0 < 5  # the abandoned thread does not hold the stop up
    out = w.output()
    assert "its thread is abandoned and replaced" in out
    assert "1 timed out, 1 threads abandoned" in out


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_an_async_handler_past_its_limit_is_stopped_at_its_await(workers):  # noqa: F811
    """Thread pool: the watchdog cancels the coroutine's asyncio task on its event loop, so
    asyncio.CancelledError reaches it in its asyncio.sleep(600): the job fails with JobTimeout,
    and its executor thread, not abandoned, runs the next job."""
    slow = rws.enqueue("test.async_sleep", "a", timeout=1, max_retries=0)
    w = workers("--workers", "1", jobs=FAST)
    wait_for(lambda: failed(slow), timeout=10, what="the async job to time out")
    assert Job.objects.get(id=slow).last_error == "JobTimeout: ran longer than 1 s"
    assert run_counts("stopped") == {"a": 1}
    rws.enqueue("test.record", "after")
    wait_for(lambda: run_counts() == {"after": 1}, timeout=10, what="the next job")
    w.signal(signal.SIGTERM)
    assert w.wait() == 0, w.output()
    assert "1 timed out, 0 threads abandoned" in w.output()


def test_limits_shorter_than_the_watchdogs_own_steps_keep_the_books():
    """A JobTimeout may arrive at any bytecode once a job is watched, also before the handler
    starts: it is the job's outcome, never an exception out of Watchdog.run, and no watch is left
    behind (left behind, it was abandoned later and freed its executor's slot a second time)."""
    import threading

    from django_rws_jobs.worker.shared import Shared
    from django_rws_jobs.worker.timeouts import Watchdog

    shared = Shared("default", 4)
    watchdog = Watchdog(shared, 0.3)
    threading.Thread(target=watchdog.loop, daemon=True).start()
    escaped: list[BaseException] = []

    def executor(n: int) -> None:
        for i in range(n):
            job = Claimed(
                f"{threading.get_ident()}-{i}",
                "test.busy",
                "0.002",
                "default",
                0,
                0,
                0,
                0,
                0,
                None,
                None,
                None,
                None,
                "t#1",
            )
            try:
                watchdog.run(job, 0.0001)
            except BaseException as exc:  # noqa: BLE001
                escaped.append(exc)

    threads = [threading.Thread(target=executor, args=(500,), daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "an executor thread is stuck"
    time.sleep(0.5)  # past the grace: a watch left behind would be abandoned now
    closing = threading.Thread(target=watchdog.close, daemon=True)
    closing.start()
    closing.join(5)
    assert not closing.is_alive(), "the watchdog's wake-up is stuck"
    assert escaped == [] and watchdog.watches == set()
    assert shared.stats.abandoned == 0 and shared.results.qsize() == 0 and shared.free == 4


@pytest.mark.django_db(transaction=True)
def test_an_abandoned_handler_that_ends_with_system_exit_is_recorded_once(settings):
    """The watchdog records the failure of a thread it abandons; when the handler later returns
    from its blocking call and raises SystemExit, the executor does not record it again nor free
    its slot twice (the dispatcher would claim more jobs than it has executors)."""
    import threading

    from django_rws_jobs.worker import Worker

    settings.RWS_JOBS = {"TIMEOUT_GRACE": 0.3, "SHUTDOWN_TIMEOUT": 3}
    stuck = rws.enqueue("test.blocked_then_exit", "1.5", timeout=0.3, max_retries=0)
    worker = Worker(threads=1, schedules=False)
    t = threading.Thread(target=worker.run, daemon=True)
    t.start()
    try:
        wait_for(lambda: failed(stuck), timeout=10, what="the blocked job to fail")
        time.sleep(1.8)  # the handler's sleep returns and it raises SystemExit
        assert worker.shared.free == 1
        assert worker.shared.stats.dead == 1 and worker.shared.stats.lost == 0
    finally:
        worker.stop()
        t.join(10)
    assert Job.objects.get(id=stuck).last_error == "JobTimeout: ran longer than 0.3 s"


# -- the process pool's dispatcher ----------------------------------------------------------------


@pytest.mark.parametrize("recent_run", [0.5, 5.0, None])
def test_short_jobs_are_claimed_for_several_executors_at_once(monkeypatch, recent_run):
    """With jobs under GATHER_MAX on average, the dispatcher waits up to one job's time for busy
    executors to return, so that one claim serves them all; with longer jobs, or unmeasured (the
    thread pool), it claims for the idle ones at once. (GATHER_MAX is raised to 1 s here, so
    that a loaded machine's thread switches fit the window.)"""
    import threading

    from django.db import connection

    from django_rws_jobs.database.backends import backend_for
    from django_rws_jobs.worker import dispatcher as module
    from django_rws_jobs.worker.shared import Shared

    monkeypatch.setattr(module, "GATHER_MAX", 1.0)
    shared = Shared("default", 4)
    shared.free, shared.recent_run = 1, recent_run
    dispatcher = module.Dispatcher(
        shared, backend_for(connection).features, queues=None, burst=True, max_jobs=None, poll_interval=1
    )

    def return_three() -> None:  # runs once the dispatcher waits (cond.wait releases the lock)
        with shared.cond:
            shared.free = 4
            shared.cond.notify_all()

    t0 = time.monotonic()
    with shared.cond:  # (an RLock: the dispatcher takes it again, and its wait lets it go)
        if recent_run == 0.5:
            threading.Thread(target=return_three).start()
        n, _ = dispatcher._claim_size()
    assert n == (4 if recent_run == 0.5 else 1)
    assert time.monotonic() - t0 < 0.5
