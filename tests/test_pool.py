"""rws_worker --pool processes as real processes: children killed on a timeout, a child killed
mid-job, children recycled, shutdown and a second signal."""

import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

import django_rws_jobs as rws
from django_rws_jobs.models import Job
from tests.test_worker import (  # noqa: F401  (workers: a fixture)
    run_counts,
    stop_and_see_handed_back,
    wait_for,
    workers,
)
from tests.testapp.models import Run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

FAST = {"BACKOFF_INITIAL": 0.1, "TIMEOUT_GRACE": 1, "POLL_INTERVAL": 0.1}
POOL = ("--pool", "processes")


def gone(pid: int) -> bool:
    """The process has exited (a zombie counts as gone: it runs nothing)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except (FileNotFoundError, ProcessLookupError):
        return True


def child_of(kind: str) -> int:
    wait_for(lambda: Run.objects.filter(kind=kind).exists(), what=f"a {kind!r} job to start")
    return Run.objects.filter(kind=kind).values_list("pid", flat=True).first()


def failed(job_id: str) -> bool:
    return Job.objects.filter(id=job_id, status="failed").exists()


def next_job_runs_then_stop(w, said: str) -> None:
    """A new child runs the next job; SIGTERM stops the worker with exit code 0 and its stats."""
    rws.enqueue("test.record", "after")
    wait_for(lambda: run_counts() == {"after": 1}, timeout=10, what="a new child to run the next job")
    w.signal(signal.SIGTERM)
    assert w.wait() == 0, w.output()
    assert said in w.output()


def test_handlers_run_in_child_processes(workers):  # noqa: F811
    for i in range(6):
        rws.enqueue("test.pid", str(i))
    w = workers("--workers", "2", *POOL, "--burst")
    assert w.wait() == 0, w.output()
    pids = set(Run.objects.values_list("pid", flat=True))
    assert len(run_counts("pid")) == 6 and w.proc.pid not in pids and 1 <= len(pids) <= 2


def test_a_child_stuck_in_a_blocking_call_is_killed_and_the_next_job_runs(workers):  # noqa: F811
    stuck = rws.enqueue("test.block", "stuck", timeout=1, max_retries=0)
    w = workers("--workers", "1", *POOL, jobs=FAST)
    pid = child_of("block")
    wait_for(lambda: failed(stuck), timeout=10, what="the blocked job to fail")
    assert Job.objects.get(id=stuck).last_error == "JobTimeout: ran longer than 1 s"
    wait_for(lambda: gone(pid), timeout=5, what="its child to be killed")
    next_job_runs_then_stop(w, "1 timed out")


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace(workers):  # noqa: F811
    stuck = rws.enqueue("test.block_ignoring_sigterm", "stuck", timeout=1, max_retries=0)
    w = workers("--workers", "1", *POOL, jobs=FAST)
    pid = child_of("block")
    t0 = time.monotonic()
    wait_for(lambda: failed(stuck), timeout=10, what="the job to fail")
    assert time.monotonic() - t0 < 1 + 1 + 2  # its limit, the grace, some slack
    assert gone(pid)  # SIGKILL: the failure is recorded only once the child is gone
    w.signal(signal.SIGTERM)
    assert w.wait() == 0, w.output()


def test_a_child_killed_mid_job_is_a_failed_attempt_recorded_at_once(workers):  # noqa: F811
    job_id = rws.enqueue("test.sleep", "30", max_retries=1)
    w = workers("--workers", "1", *POOL, jobs={**FAST, "BACKOFF_INITIAL": 30})
    pid = child_of("start")
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    wait_for(lambda: Job.objects.filter(id=job_id, status="pending").exists(), timeout=5, what="the failure")
    assert time.monotonic() - t0 < 1.0
    job = Job.objects.get(id=job_id)
    assert (job.attempts, job.last_error) == (1, "worker child died: killed by signal SIGKILL")
    next_job_runs_then_stop(w, "1 child processes lost mid-job")


def test_max_jobs_per_child_recycles_children_losing_no_job(workers):  # noqa: F811
    for i in range(20):
        rws.enqueue("test.pid", str(i))
    w = workers("--workers", "2", *POOL, "--max-jobs-per-child", "3", "--burst")
    assert w.wait(120) == 0, w.output()
    assert run_counts("pid") == Counter(str(i) for i in range(20))  # each job exactly once
    per_child = Counter(Run.objects.values_list("pid", flat=True))
    assert max(per_child.values()) <= 3 and len(per_child) >= 7, per_child
    assert not Job.objects.exists()


def test_max_memory_per_child_recycles_children_losing_no_job(workers):  # noqa: F811
    for _ in range(6):
        rws.enqueue("test.leak", "80")
    w = workers("--workers", "1", *POOL, "--max-memory-per-child", "150", "--burst")
    assert w.wait(120) == 0, w.output()
    assert Run.objects.filter(kind="leak").count() == 6 and not Job.objects.exists()
    per_child = Counter(Run.objects.values_list("pid", flat=True))
    assert max(per_child.values()) <= 2 and len(per_child) >= 3, per_child
    assert "--max-memory-per-child 150" in w.output()


def test_sigterm_hands_back_unfinished_jobs_uncharged_and_ends_their_children(workers):  # noqa: F811
    job_id = rws.enqueue("test.sleep", "20")
    done = rws.enqueue("test.sleep", "0.5")
    w = workers("--workers", "2", *POOL, jobs={**FAST, "SHUTDOWN_TIMEOUT": 1.5})
    wait_for(lambda: Run.objects.filter(kind="start").count() == 2, what="both jobs to start")
    pid = Run.objects.get(kind="start", payload="20").pid
    stop_and_see_handed_back(w, job_id, within=10)
    assert not Job.objects.filter(id=done).exists()  # the short one finished within the timeout
    wait_for(lambda: gone(pid), timeout=5, what="the child to end")


def test_a_second_signal_kills_the_children(workers):  # noqa: F811
    rws.enqueue("test.sleep", "20")
    w = workers("--workers", "1", *POOL)
    pid = child_of("start")
    w.signal(signal.SIGINT)
    time.sleep(0.3)
    w.signal(signal.SIGINT)
    assert w.wait(10) != 0
    wait_for(lambda: gone(pid), timeout=5, what="the child to be killed")


def test_pool_options_are_checked(workers):  # noqa: F811
    w = workers("--max-jobs-per-child", "3", "--burst")
    assert w.wait() != 0 and "need --pool processes" in w.output()
    w = workers(*POOL, "--max-memory-per-child", "0", "--burst")
    assert w.wait() != 0 and "is not a whole number of at least 1" in w.output()


def test_a_handler_raising_system_exit_ends_its_child_and_the_next_job_is_not_charged(workers):  # noqa: F811
    rws.enqueue("test.system_exit", "boom", max_retries=0)
    for i in range(3):
        rws.enqueue("test.pid", str(i), max_retries=0)
    w = workers("--workers", "1", *POOL, "--burst")
    assert w.wait() == 0, w.output()
    assert list(Job.objects.values_list("last_error", flat=True)) == ["SystemExit: 3"]
    assert run_counts("pid") == {"0": 1, "1": 1, "2": 1}  # each ran once, none lost with the child
    exited = Run.objects.get(kind="system_exit").pid
    assert exited not in set(Run.objects.filter(kind="pid").values_list("pid", flat=True))


def test_several_worker_processes_each_with_a_process_pool(workers):  # noqa: F811
    for i in range(40):
        rws.enqueue("test.pid", str(i))
    w = workers("--processes", "2", "--workers", "2", *POOL, "--burst")
    assert w.wait(120) == 0, w.output()
    assert run_counts("pid") == Counter(str(i) for i in range(40)) and not Job.objects.exists()
