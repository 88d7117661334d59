"""rws_worker as real processes: draining, leases, crash recovery, signals."""

import json
import os
import re
import signal
import subprocess
import sys
import time
import weakref
from collections import Counter
from pathlib import Path

import pytest

import django_rws_jobs as rws
from django_rws_jobs.models import Job
from tests.conftest import ROOT, subprocess_env
from tests.features import skip_unless_db_feature
from tests.testapp.models import Run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


class WorkerProcess:
    def __init__(
        self,
        tmp_path: Path,
        *args: str,
        jobs: dict | None = None,
        name: str = "worker",
        new_session: bool = False,
        env: dict[str, str] | None = None,
    ):
        """``env``: variables set for this worker besides the test run's (tests/test_clock.py's
        libfaketime, tests/test_dead_connections.py's proxy port)."""
        self.log = tmp_path / f"{name}-{time.monotonic_ns()}.log"
        env = subprocess_env(RWS_TEST_JOBS=json.dumps(jobs or {}), **(env or {}))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "django", "rws_worker", *args],
            cwd=ROOT,
            env=env,
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=new_session,
        )
        LIVE.add(self)

    def output(self) -> str:
        return self.log.read_text()

    def started(self, timeout: float = 30) -> None:
        """Wait for the start-up line, which the worker logs once its signal handlers are set: a
        signal sent earlier kills it as any process (a loaded machine can take seconds)."""
        wait_for(
            lambda: " starting: " in self.output(), timeout, what=f"the worker to start:\n{self.output()}"
        )

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"worker did not exit within {timeout}s:\n{self.output()}") from None

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def children(self) -> list[int]:
        """The pids of the worker processes this one logged the start of (--processes)."""
        pids = {int(pid) for pid in re.findall(r"worker [^ :]+:(\d+):\w+ starting: ", self.output())}
        return sorted(pids - {self.proc.pid})

    def stop(self) -> None:
        """SIGKILL it and the children it started: none lives on into the next test."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in self.children():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def workers(tmp_path):
    started: list[WorkerProcess] = []

    def start(*args, **kwargs) -> WorkerProcess:
        w = WorkerProcess(tmp_path, *args, **kwargs)
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop()


def wait_for(predicate, timeout=30.0, what="condition"):
    """Wait until ``predicate()``; on a timeout, fail with every live worker's thread dump."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}{thread_dumps()}")


#: A line of each thread dump: the main thread's frame (not "Current thread", which a dump taken
#: by a thread with no Python frame leaves out).
DUMPED = "in _run_worker"
#: The workers the tests started, while they live (a timed-out wait dumps their threads).
LIVE: weakref.WeakSet = weakref.WeakSet()


def thread_dumps() -> str:
    """Ask each live worker for its threads' stacks (SIGUSR1, rws_worker's print_stacks) and
    return what they printed."""
    live = [(w, len(w.output())) for w in LIVE if w.proc.poll() is None]
    for w, _ in live:
        w.signal(signal.SIGUSR1)
    dumps = []
    for w, start in live:
        deadline = time.monotonic() + 5
        while DUMPED not in w.output()[start:] and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # the rest of it (and the other children's, with --processes)
        # The log as it is now (a ``what`` built when the wait began shows it as it was then),
        # then the dump.
        log = "\n".join(w.output()[:start].splitlines()[-150:])
        dumps.append(
            f"\n--- {w.log.name} (pid {w.proc.pid}): its log at the timeout ---\n{log}"
            f"\n--- its threads ---\n{w.output()[start:]}"
        )
    return "".join(dumps)


def run_counts(kind="record"):
    return Counter(Run.objects.filter(kind=kind).values_list("payload", flat=True))


def dump_shows(w, texts, count=1):
    """Signal ``w`` with SIGUSR1 and wait for a dump that shows each of ``texts`` ``count``
    times: the roles' threads start one after the other after the start-up line."""
    start = len(w.output())
    w.signal(signal.SIGUSR1)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        dump = w.output()[start:]
        if dump.count(DUMPED) >= count:
            time.sleep(0.2)  # the rest of the dumps
            return all(w.output()[start:].count(t) >= count for t in texts)
        time.sleep(0.05)
    return False


ROLES = ("dispatcher.py", "completer.py", "keeper.py", "executor.py", "supervisor.py")


def test_sigusr1_prints_every_threads_stack(tmp_path, started):
    w = WorkerProcess(tmp_path, "--workers", "2")
    started.append(w)
    w.started()
    wait_for(lambda: dump_shows(w, ROLES), 30, what=f"a dump of every role:\n{w.output()}")
    assert w.proc.poll() is None  # it goes on
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0


def test_sigusr1_never_kills_a_busy_worker(tmp_path, started):
    """100 SIGUSR1s, 10 ms apart, while 4 threads run 300 jobs: the worker prints its stacks each
    time and goes on. Walking the threads' frames from C while they ran (faulthandler) killed
    such a worker with SIGSEGV about once in five runs of this loop."""
    rws.enqueue_many([("test.record", str(i)) for i in range(300)])
    w = WorkerProcess(tmp_path, "--workers", "4")
    started.append(w)
    w.started()
    for _ in range(100):
        assert w.proc.poll() is None, w.output()[-3000:]
        w.signal(signal.SIGUSR1)
        time.sleep(0.01)
    wait_for(lambda: len(run_counts()) == 300, 60, what="the 300 jobs")
    assert w.proc.poll() is None, w.output()[-3000:]
    assert w.output().count(DUMPED) >= 50  # (signals sent close together may merge into one)
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0, w.output()[-3000:]


def test_sigusr1_to_the_parent_of_processes_reaches_each_child(tmp_path, started):
    w = WorkerProcess(tmp_path, "--processes", "2")
    started.append(w)
    wait_for(lambda: w.output().count(" starting: ") == 2, 30, what=f"two children:\n{w.output()}")
    wait_for(lambda: dump_shows(w, ROLES, count=2), 30, what=f"two dumps:\n{w.output()}")
    assert w.proc.poll() is None
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0


def test_children_of_a_killed_parent_stop(tmp_path, started):
    """kill -9 of the parent of --processes: each child sees it gone within a supervisor turn,
    stops as on SIGTERM and hands back the job it runs; no worker goes on unwatched."""
    job_id = rws.enqueue("test.sleep", "30")
    w = WorkerProcess(tmp_path, "--processes", "2", "--workers", "1", jobs={"SHUTDOWN_TIMEOUT": 1})
    started.append(w)
    wait_for(lambda: len(w.children()) == 2, 30, what=f"two children:\n{w.output()}")
    wait_for(lambda: Run.objects.filter(kind="start").exists(), what="the job to start")
    children = w.children()
    w.proc.kill()
    w.proc.wait()

    def gone() -> bool:
        for pid in children:
            try:
                os.kill(pid, 0)  # an orphan's zombie is reaped by init at once
            except ProcessLookupError:
                continue
            return False
        return True

    wait_for(gone, 15, what=f"the children to exit:\n{w.output()}")
    assert w.output().count("is gone: stopping") == 2, w.output()
    job = Job.objects.get(id=job_id)
    assert (job.status, job.attempts, job.locked_by) == ("pending", 0, None)


def test_three_processes_drain_300_jobs_each_once(workers):
    for i in range(300):
        rws.enqueue("test.record", str(i))
    procs = [workers("--workers", "4", "--burst") for _ in range(3)]
    for w in procs:
        assert w.wait(120) == 0, w.output()
    counts = run_counts()
    assert sorted(counts) == sorted(str(i) for i in range(300))
    assert set(counts.values()) == {1}
    assert Job.objects.count() == 0
    for w in procs:
        assert "locked" not in w.output().lower(), w.output()
        assert "Traceback" not in w.output(), w.output()


def test_queues_option_limits_the_worker(workers):
    rws.enqueue("test.record", "a", queue="a")
    rws.enqueue("test.record", "b", queue="b")
    rws.enqueue("test.record", "c", queue="c")
    assert workers("--queues", "a,c", "--burst").wait() == 0
    assert sorted(run_counts()) == ["a", "c"]
    assert list(Job.objects.values_list("queue", flat=True)) == ["b"]


def test_a_worker_starts_while_another_database_is_down(workers):
    # Its system checks look at the queue's database only: Django 6.1's model checks connect to
    # every alias unless told which (management.QueueCommand).
    rws.enqueue("test.record", "x")
    w = workers("--burst", env={"RWS_TEST_DOWN_ALIAS": "9"})
    assert w.wait() == 0, w.output()
    assert run_counts() == {"x": 1}


def test_max_jobs_stops_the_worker(workers):
    for i in range(5):
        rws.enqueue("test.record", str(i))
    assert workers("--max-jobs", "2").wait() == 0
    assert len(run_counts()) == 2 and Job.objects.count() == 3


def test_a_worker_holds_no_more_jobs_than_it_has_threads(workers):
    # The dispatcher claims only for idle executors: a worker never holds a job it cannot start
    # now, so what it cannot run stays pending for other workers (and keeps its place in the
    # queue's order, its lease its meaning).
    for i in range(6):
        rws.enqueue("test.sleep", f"0.4{i}")
    w = workers("--workers", "2", "--burst")
    peak = 0
    while w.proc.poll() is None:
        # Held: claimed and not finished. (A finished job's row stays 'running' until the
        # completer deletes it, while its thread may already have the next one.) Read in this
        # order, a job that ends between the two reads is not counted: never one too many.
        claimed = set(Job.objects.filter(status="running").values_list("payload", flat=True))
        peak = max(peak, len(claimed - set(run_counts("end"))))
        time.sleep(0.01)
    assert w.wait() == 0, w.output()
    assert len(run_counts("end")) == 6 and Job.objects.count() == 0
    assert peak == 2  # both threads busy at once, never more held


def test_a_handlers_connection_is_closed_after_each_job(workers):
    # Django's request hygiene, per job: with CONN_MAX_AGE = 0 (the default) the connection a
    # handler opened is closed when the job ends, so the next job on that thread opens its own.
    for i in range(3):
        rws.enqueue("test.connection", str(i))
    assert workers("--workers", "1", "--burst").wait() == 0
    opened = sorted(run_counts("connection"), key=lambda p: int(p.split(":")[0]))
    counts = [int(p.split(":")[1]) for p in opened]
    assert len(counts) == 3 and counts[0] < counts[1] < counts[2], opened


def test_a_second_worker_leaves_a_live_lease_alone(workers):
    job_id = rws.enqueue("test.sleep", "3")
    first = workers("--workers", "1")
    wait_for(lambda: Run.objects.filter(kind="start").exists(), what="the job to start")
    second = workers("--workers", "2", "--burst")
    assert second.wait() == 0, second.output()
    assert Job.objects.get(id=job_id).status == "running"
    wait_for(lambda: not Job.objects.filter(id=job_id).exists(), what="the first worker to finish")
    assert run_counts("start") == {"3": 1} and run_counts("end") == {"3": 1}
    first.signal(signal.SIGTERM)
    assert first.wait() == 0


def test_kill_9_loses_nothing_and_reruns_at_most_the_jobs_in_flight(workers):
    n = 24
    for i in range(n):
        rws.enqueue("test.sleep", "0.4" if i % 2 else "0.2")
    fast = {"LEASE_SECONDS": 2, "RECOVERY_INTERVAL": 0.5}
    victim = workers("--workers", "4", jobs=fast)
    wait_for(lambda: Run.objects.filter(kind="end").count() >= 4, what="some jobs to finish")
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait()
    # In flight: claimed and not yet recorded. That is the jobs still executing (at most the 4
    # threads) plus any that finished but whose delete the completer had not written yet.
    in_flight = Job.objects.filter(status="running").count()
    assert in_flight >= 1
    rescuer = workers("--workers", "4", jobs=fast)
    wait_for(lambda: Job.objects.count() == 0, timeout=60, what="every job to finish")
    rescuer.signal(signal.SIGTERM)
    assert rescuer.wait() == 0
    starts = Run.objects.filter(kind="start").count()
    ends = Run.objects.filter(kind="end").count()
    assert ends >= n  # every job finished at least once
    assert starts - n <= in_flight  # re-runs are bounded by the jobs that were in flight
    assert "recovered: worker lost" in rescuer.output()


def test_a_job_that_kills_its_worker_ends_dead_after_its_retries(workers):
    job_id = rws.enqueue("test.exit", "x", max_retries=1)
    fast = {"LEASE_SECONDS": 2, "BACKOFF_INITIAL": 0.1}
    outputs = []
    for _ in range(12):
        w = workers("--burst", jobs=fast)
        w.wait()
        outputs.append(w.output())
        if Job.objects.get(id=job_id).status == "failed":
            break
        time.sleep(1.0)
    job = Job.objects.get(id=job_id)
    assert job.status == "failed", "\n".join(outputs)
    assert job.attempts == 2 and "worker lost" in job.last_error
    assert Run.objects.filter(kind="exit").count() == 2  # the first run and its one retry
    assert any("moved to the dead-letter list" in o for o in outputs)


#: The start-up line's words on the queue's clock: one shape on every database (clock.describe).
CLOCK = re.compile(
    r"clock: (the database's \(this host's is \d+\.\d{3}s (behind|ahead of) it\)"
    r"|this host's \(the database has no clock of its own\))"
)
ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"


def test_the_log_says_why_a_job_failed_and_which_clock_decides(workers):
    """Every failed attempt is logged with the error's first line, an unregistered job type's on
    its first attempt; the traceback only on the last attempt (at -v 1); times in ISO 8601 UTC."""
    typo = rws.enqueue("test.nope", "x")
    retried = rws.enqueue("test.fail", "once", max_retries=1)
    dead = rws.enqueue("test.fail", "last", max_retries=0)
    w = workers("--burst", "--no-schedules", jobs={"BACKOFF_INITIAL": 3600})
    assert w.wait() == 0
    out = w.output()
    starting = next(line for line in out.splitlines() if " starting: " in line)
    assert CLOCK.search(starting), starting
    assert re.search(
        rf"job {typo} \(test.nope\) failed on attempt 1 of 4: no handler registered for job_type "
        rf"'test.nope'; will retry at {ISO}\n",
        out,
    ), out
    assert re.search(
        rf"job {retried} \(test.fail\) failed on attempt 1 of 2: ValueError: boom once; "
        rf"will retry at {ISO}\n",
        out,
    ), out
    assert (
        f"job {dead} (test.fail) failed on attempt 1 of 1: ValueError: boom last; "
        "moved to the dead-letter list\nTraceback" in out
    )
    assert out.count("Traceback (most recent call last)") == 1, out  # the last attempt's only


def test_verbosity_2_logs_each_success_with_its_duration(workers):
    """At -v 2 each success is logged with its duration and each failure with its traceback."""
    done = rws.enqueue("test.record", "a")
    failed = rws.enqueue("test.fail", "b")
    w = workers("--burst", "--no-schedules", "-v", "2", jobs={"BACKOFF_INITIAL": 3600})
    assert w.wait() == 0
    out = w.output()
    assert re.search(rf"job {done} \(test.record\) succeeded in \d+\.\d{{3}}s\n", out), out
    assert f"job {failed} (test.fail) failed on attempt 1 of 4: ValueError: boom b; will retry at " in out
    assert "Traceback (most recent call last)" in out, out


def test_reload_restarts_the_worker_when_a_python_file_changes(workers):
    """rws_worker --reload (Django's autoreloader): a changed Python file of the project stops the
    worker as SIGTERM does and starts a new process, which runs what is enqueued next."""
    watched = ROOT / "tests" / "testapp" / "jobs.py"
    kept = watched.stat()
    w = workers("--reload", "--no-schedules")
    w.started()
    [first] = w.children()  # the reloader's child, not the process the test started
    try:
        # The reloader looks at the files once a second, from a first look the test cannot see:
        # the file is made newer until a second worker starts.
        deadline = time.monotonic() + 60
        bump = 0
        while w.output().count(" starting: ") < 2:
            assert time.monotonic() < deadline, f"no restart:\n{w.output()}"
            bump += 1
            os.utime(watched, (kept.st_atime, kept.st_mtime + bump))
            time.sleep(0.5)
    finally:
        os.utime(watched, (kept.st_atime, kept.st_mtime))
    out = w.output()
    assert out.index("worker stopped: ") < out.rindex(" starting: "), out  # the first stopped first
    [second] = set(w.children()) - {first}
    wait_for(lambda: not os.path.exists(f"/proc/{first}"), 10, what="the first worker process to end")
    rws.enqueue("test.record", "after")
    wait_for(lambda: run_counts() == Counter({"after": 1}), 30, what=f"the job to run:\n{w.output()}")
    assert w.proc.poll() is None and os.path.exists(f"/proc/{second}")


def test_sigterm_lets_the_running_job_finish_and_exits_0(workers):
    job_id = rws.enqueue("test.sleep", "1.5")
    w = workers("--workers", "2")
    wait_for(lambda: Run.objects.filter(kind="start").exists(), what="the job to start")
    t0 = time.monotonic()
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0, w.output()
    assert time.monotonic() - t0 < 10
    assert run_counts("end") == {"1.5": 1}
    assert not Job.objects.filter(id=job_id).exists()
    assert "worker stopped: 1 done" in w.output()


def stop_and_see_handed_back(w: WorkerProcess, job_id: str, within: float) -> None:
    """SIGTERM ``w``: it exits 0 within ``within`` seconds, and the unfinished job ``job_id`` is
    pending again, its attempt not charged, its lease gone."""
    t0 = time.monotonic()
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0, w.output()
    assert time.monotonic() - t0 < within
    job = Job.objects.get(id=job_id)
    assert (job.status, job.attempts, job.locked_by) == ("pending", 0, None)
    assert "handed back: interrupted" in w.output()


def test_sigterm_hands_back_what_does_not_finish_in_time(workers):
    job_id = rws.enqueue("test.sleep", "20")
    w = workers("--workers", "1", jobs={"SHUTDOWN_TIMEOUT": 1})
    wait_for(lambda: Run.objects.filter(kind="start").exists(), what="the job to start")
    stop_and_see_handed_back(w, job_id, within=8)


def test_a_second_signal_exits_at_once(workers):
    rws.enqueue("test.sleep", "20")
    w = workers("--workers", "1")
    wait_for(lambda: Run.objects.filter(kind="start").exists(), what="the job to start")
    w.signal(signal.SIGINT)
    time.sleep(0.3)
    t0 = time.monotonic()
    w.signal(signal.SIGINT)
    assert w.wait(10) != 0
    assert time.monotonic() - t0 < 5
    assert Job.objects.get().status == "running"  # its lease will expire; recovery takes it


def test_idle_worker_stops_at_once(workers):
    w = workers("--workers", "3", jobs={"POLL_INTERVAL": 30})
    w.started()
    time.sleep(1)  # idle by now: its first claim found nothing
    t0 = time.monotonic()
    w.signal(signal.SIGTERM)
    assert w.wait(10) == 0
    assert time.monotonic() - t0 < 3


def test_a_thread_killed_by_system_exit_is_replaced(workers):
    rws.enqueue("test.system_exit", "boom", max_retries=0)
    w = workers("--workers", "1")
    wait_for(lambda: Job.objects.filter(status="failed").exists(), what="the job to fail")
    rws.enqueue("test.record", "after")
    wait_for(lambda: run_counts() == {"after": 1}, what="the replacement thread to run a job")
    w.signal(signal.SIGTERM)
    assert w.wait() == 0
    assert "died" in w.output()
    assert Job.objects.get().last_error == "SystemExit: 3"


def test_a_thread_that_keeps_dying_is_restarted_later_each_time(workers):
    # Each of these jobs kills the only executor thread at once: the second death in a row waits
    # 1 s before the restart, the third 2 s (instead of a restart every half second for ever).
    for i in range(3):
        rws.enqueue("test.system_exit", str(i), max_retries=0)
    w = workers("--workers", "1")
    wait_for(lambda: Job.objects.filter(status="failed").count() == 3, timeout=30, what="the jobs to fail")
    rws.enqueue("test.record", "after")
    wait_for(lambda: run_counts() == {"after": 1}, timeout=30, what="the replacement thread to run a job")
    w.signal(signal.SIGTERM)
    assert w.wait() == 0
    out = w.output()
    assert "worker thread rws-job-0 stopped; starting a new one\n" in out, out
    assert "starting a new one in 1s (it stopped 2 times in a row)" in out, out
    assert "starting a new one in 2s (it stopped 3 times in a row)" in out, out


def test_bad_options_are_refused(workers):
    w = workers("--workers", "0")
    assert w.wait() != 0
    assert "--workers" in w.output()
    w = workers("--database", "nope")
    assert w.wait() != 0
    assert "database alias 'nope' is not in DATABASES" in w.output()


def test_workers_and_a_web_process_share_the_database_without_lock_errors(workers):
    # A "web process" that reads, then writes and enqueues in one transaction, as a view does,
    # while three workers drain: on SQLite this is where "database is locked" would surface.
    for i in range(150):
        rws.enqueue("test.record", f"pre-{i}")
    web = (
        "from django.db import transaction\n"
        "from django_rws_jobs import enqueue\n"
        "from tests.testapp.models import Order\n"
        "for i in range(150):\n"
        "    with transaction.atomic():\n"
        "        Order.objects.count()\n"
        "        Order.objects.create(number=str(i))\n"
        "        enqueue('test.record', f'web-{i}')\n"
        "print('WEB DONE')\n"
    )
    from tests.conftest import run_python
    from tests.testapp.models import Order

    procs = [workers("--workers", "2") for _ in range(3)]
    view = run_python(web)
    out, _ = view.communicate(timeout=120)
    assert view.returncode == 0 and "WEB DONE" in out, out
    wait_for(lambda: Job.objects.count() == 0, timeout=60, what="the queue to drain")
    for w in procs:
        w.signal(signal.SIGTERM)
    for w in procs:
        assert w.wait() == 0
        assert "locked" not in w.output().lower(), w.output()
    assert Order.objects.count() == 150
    counts = run_counts()
    assert len(counts) == 300 and set(counts.values()) == {1}


def test_processes_option_shares_the_work_and_stops_cleanly(workers):
    for i in range(200):
        rws.enqueue("test.record", str(i))
    burst = workers("--processes", "2", "--workers", "2", "--burst")
    assert burst.wait(60) == 0, burst.output()
    counts = run_counts()
    assert len(counts) == 200 and set(counts.values()) == {1}
    assert len(set(Run.objects.values_list("pid", flat=True))) == 2  # both processes ran jobs
    assert burst.output().count("starting: 2 thread(s)") == 2
    rws.enqueue("test.sleep", "1")
    w = workers("--processes", "2", "--workers", "1")
    wait_for(lambda: Run.objects.filter(kind="start").exists(), what="the job to start")
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0, w.output()
    assert run_counts("end") == {"1": 1} and Job.objects.count() == 0
    assert w.output().count("worker stopped") == 2


@pytest.mark.skipif(os.environ.get("RWS_TEST_DB", "sqlite") != "postgres", reason="PostgreSQL setting")
def test_the_workers_settings_hold_for_its_statements_and_end_with_them(settings):
    from django_rws_jobs.database.backends import backend_for
    from django_rws_jobs.database.connections import private_connection

    names = ("synchronous_commit", "enable_seqscan", "enable_sort", "enable_incremental_sort", "jit")
    current = "SELECT " + ", ".join(f"current_setting('{n}')" for n in names)

    def session(conn):
        with conn.cursor() as c:
            c.execute(current)
            return c.fetchone()

    conn = private_connection("default")
    try:
        scoped = backend_for(conn).driver_cursor()  # what the worker's Store sends its statements with
        scoped.execute(current)
        assert scoped.fetchone() == ("off",) * 5  # prepared plans keep to the indexes
        # ... for that statement's transaction only: the session (which a transaction pooler
        # lends to other clients next) keeps the server's values.
        assert session(conn) == ("on",) * 5
        scoped.execute("BEGIN")
        scoped.execute(current)
        assert scoped.fetchone() == ("off",) * 5
        scoped.execute("COMMIT")
        assert session(conn) == ("on",) * 5
        # Disabled sorts price the band walk's sort of its own rows above jit_above_cost: JIT
        # compiled it for 170 ms. It must be off for the worker's statements.
        band_walk = backend_for(conn).due_band_select(None, None, 0)
        scoped.execute("EXPLAIN " + band_walk.text, band_walk.params)
        text = "\n".join(r[0] for r in scoped.fetchall())
        with conn.cursor() as c:
            c.execute("SHOW jit_above_cost")
            assert float(text.split("..")[1].split()[0]) > float(c.fetchone()[0]), text
        assert "JIT" not in text, text
    finally:
        conn.close()
    settings.RWS_JOBS = {"WORKER_SYNCHRONOUS_COMMIT": True}
    conn = private_connection("default")
    try:
        scoped = backend_for(conn).driver_cursor()
        scoped.execute(current)
        assert scoped.fetchone() == ("on",) + ("off",) * 4
    finally:
        conn.close()


@pytest.mark.skipif(os.environ.get("RWS_TEST_DB", "sqlite") != "postgres", reason="PostgreSQL setting")
@pytest.mark.skipif(
    bool(os.environ.get("RWS_TEST_POOLER")), reason="reads pg_prepared_statements of a session"
)
def test_worker_prepares_its_hot_statements_unless_behind_a_transaction_pooler(settings):
    from django_rws_jobs.database.backends.postgresql import prologue
    from django_rws_jobs.database.connections import private_connection
    from django_rws_jobs.queue.store import Store

    def prepared_after_a_drain(**database):
        for i in range(12):
            rws.enqueue("test.noop", str(i))
        db.clear()
        db.update(original, **database)
        claimer = Store(private_connection("default"))
        try:
            for i in range(6):
                now = int(time.time())
                claimer.complete_many(claimer.claim(f"t{i}", now, now + 60, None, 2))
            with claimer.conn.cursor() as c:
                c.execute("SELECT statement FROM pg_prepared_statements")
                return [re.sub(r"^PREPARE rws_\w+ AS ", "", r[0]).split(" WHERE")[0] for r in c.fetchall()]
        finally:
            claimer.conn.close()

    db = settings.DATABASES["default"]  # the dict Django's connections read
    original = dict(db)
    try:
        # The claim from the band's start, and the claim resumed after the last row taken where a
        # claim was slow (PostgreSQLBackend.claim_band): the same statement's start.
        claim = "UPDATE rws_jobs SET status = 'running', locked_by = $1, locked_until = $2, started_at = $3"
        assert set(prepared_after_a_drain()) == {
            "DELETE FROM rws_jobs",
            prologue(),  # the settings each statement's transaction gets
            claim,
        }
        assert Job.objects.count() == 0
        # Behind a transaction pooler a name would stay on one server connection: nothing is
        # prepared, whether RWS_JOBS or Django's setting says so (or, as before RWS_JOBS had
        # POOLER, OPTIONS turn off server-side binding).
        assert prepared_after_a_drain(DISABLE_SERVER_SIDE_CURSORS=True) == []
        assert (
            prepared_after_a_drain(OPTIONS={**original.get("OPTIONS", {}), "server_side_binding": False})
            == []
        )
        settings.RWS_JOBS = {"POOLER": "transaction"}
        assert prepared_after_a_drain() == []
        settings.RWS_JOBS = {"POOLER": "session"}
        assert len(set(prepared_after_a_drain(DISABLE_SERVER_SIDE_CURSORS=True))) == 3
        assert Job.objects.count() == 0
    finally:
        db.clear()
        db.update(original)  # a nested dict: the fixture would not restore it


def test_a_job_enqueued_inside_the_worker_process_wakes_it(workers):
    rws.enqueue("test.chain", "1")
    w = workers("--workers", "2", jobs={"POLL_INTERVAL": 30})
    # The first look happens at start; the follow-up job must not wait for the 30 s poll.
    wait_for(lambda: run_counts() == {"after-1": 1}, timeout=10, what="the chained job")
    w.signal(signal.SIGTERM)
    assert w.wait() == 0


def test_a_finished_job_is_deleted_at_once_by_an_idle_worker(workers):
    # On SQLite and PostgreSQL the dispatcher deletes finished jobs with its next claim: a worker
    # that goes idle after the job (its next poll 30 s away) must still delete it now, so that its
    # unique key is free for the next enqueue.
    # (A no-op handler: a handler's own write would wake an idle SQLite worker anyway.)
    first = rws.enqueue("test.noop", "once", unique="k")
    w = workers("--workers", "2", jobs={"POLL_INTERVAL": 30})
    wait_for(lambda: not Job.objects.filter(id=first).exists(), timeout=10, what="its deletion")
    w.signal(signal.SIGTERM)
    assert w.wait() == 0
    assert "1 done" in w.output()
    assert rws.enqueue("test.noop", "twice", unique="k") != first


def listening() -> int:
    """How many connections LISTEN on the workers' channel (each worker's listener holds one)."""
    from django.db import connection

    from django_rws_jobs.worker.listener import CHANNEL

    with connection.cursor() as c:
        c.execute(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE query = %s AND pid <> pg_backend_pid() "
            "AND datname = current_database()",
            [f"LISTEN {CHANNEL}"],
        )
        return c.fetchone()[0]


def start_idle_postgres_worker(workers, **kwargs) -> "WorkerProcess":
    """A worker that has started and looked for jobs once, and is now idle."""
    wait_for(lambda: listening() == 0, what="earlier workers' listeners to go")
    w = workers("--workers", "1", **kwargs)
    wait_for(lambda: listening() == 1, what="the worker's listener")
    time.sleep(0.5)  # its first look, at start, is over
    return w


def picks_up_at_once(w: "WorkerProcess", payload: str) -> None:
    """The idle worker ``w`` (its next poll 30 s away) runs a job enqueued now within 2 s, and stops."""
    before = run_counts()
    t0 = time.monotonic()
    rws.enqueue("test.record", payload)
    wait_for(lambda: run_counts() == before + Counter([payload]), timeout=10, what=f"job {payload!r}")
    assert time.monotonic() - t0 < 2
    w.signal(signal.SIGTERM)
    assert w.wait() == 0


@skip_unless_db_feature("wakeup", "listen")
@pytest.mark.skipif(
    bool(os.environ.get("RWS_TEST_POOLER")),
    reason="no LISTEN through a transaction pooler (tests/test_pooler.py)",
)
def test_notify_wakes_an_idle_postgres_worker(workers):
    w = start_idle_postgres_worker(workers, jobs={"POLL_INTERVAL": 30})  # its next poll 30 s away
    picks_up_at_once(w, "notified")


@skip_unless_db_feature("wakeup", "listen")
@pytest.mark.skipif(
    bool(os.environ.get("RWS_TEST_POOLER")),
    reason="no LISTEN through a transaction pooler (tests/test_pooler.py)",
)
def test_an_idle_postgres_worker_polls_when_no_notification_arrives(workers):
    # Behind a pooler that breaks LISTEN (PgBouncer in transaction mode) no notification reaches
    # the worker; here the insert trigger is off, which has the same effect. Polling still finds
    # the job within POLL_INTERVAL.
    from django.db import connection

    with connection.cursor() as c:
        c.execute("ALTER TABLE rws_jobs DISABLE TRIGGER rws_jobs_notify")
    try:
        w = start_idle_postgres_worker(workers, jobs={"POLL_INTERVAL": 0.5})
        t0 = time.monotonic()
        rws.enqueue("test.record", "polled")
        wait_for(lambda: run_counts() == {"polled": 1}, timeout=10, what="the polled job")
        assert time.monotonic() - t0 < 0.5 + 1.0
        w.signal(signal.SIGTERM)
        assert w.wait() == 0
        # Without polling to fall back on, the same worker would not have seen it: the channel is silent.
        quiet = start_idle_postgres_worker(workers, jobs={"POLL_INTERVAL": 30})
        rws.enqueue("test.record", "unseen")
        time.sleep(1.5)
        assert run_counts() == {"polled": 1}
        quiet.signal(signal.SIGTERM)
        assert quiet.wait() == 0
    finally:
        with connection.cursor() as c:
            c.execute("ALTER TABLE rws_jobs ENABLE TRIGGER rws_jobs_notify")


@pytest.mark.skipif(os.environ.get("RWS_TEST_DB", "sqlite") != "postgres", reason="LISTEN/NOTIFY")
@pytest.mark.skipif(
    bool(os.environ.get("RWS_TEST_POOLER")),
    reason="no LISTEN through a transaction pooler (tests/test_pooler.py)",
)
def test_the_listener_listens_again_after_losing_its_connection(workers):
    from django.db import connection

    w = start_idle_postgres_worker(workers, jobs={"POLL_INTERVAL": 30})  # its next poll 30 s away
    with connection.cursor() as c:
        c.execute(
            "SELECT pg_terminate_backend(pid), pid FROM pg_stat_activity WHERE query = %s "
            "AND datname = current_database()",  # not another test run's workers on the server
            ["LISTEN rws_jobs"],
        )
        killed = {pid for _, pid in c.fetchall()}
    assert len(killed) == 1

    def listening_anew() -> bool:
        with connection.cursor() as c:
            c.execute(
                "SELECT pid FROM pg_stat_activity WHERE query = %s AND datname = current_database()",
                ["LISTEN rws_jobs"],
            )
            return bool({pid for (pid,) in c.fetchall()} - killed)

    wait_for(listening_anew, timeout=10, what="the listener to listen again")
    time.sleep(0.5)  # its LISTEN has run
    picks_up_at_once(w, "notified")


@pytest.mark.skipif(os.environ.get("RWS_TEST_DB", "sqlite") != "sqlite", reason="PRAGMA data_version")
def test_an_idle_sqlite_worker_sees_another_process_enqueue_at_once(workers):
    w = workers("--workers", "1", jobs={"POLL_INTERVAL": 30})  # its next poll 30 s away
    rws.enqueue("test.record", "first")
    wait_for(lambda: run_counts() == {"first": 1}, timeout=10, what="the first job")
    time.sleep(0.5)  # idle again, watching the file
    picks_up_at_once(w, "second")


def test_a_group_wide_signal_stops_processes_gracefully(workers):
    # Ctrl-C in a terminal, or a service manager, signals the whole process group at once.
    rws.enqueue("test.sleep", "1")
    w = workers("--processes", "2", "--workers", "1", new_session=True)
    wait_for(lambda: Run.objects.filter(kind="start").exists(), what="the job to start")
    os.killpg(w.proc.pid, signal.SIGINT)
    assert w.wait(30) == 0, w.output()
    assert "second signal" not in w.output()
    assert run_counts("end") == {"1": 1} and Job.objects.count() == 0


def test_a_forked_process_gets_a_worker_id_of_its_own():
    # In a child of its own: this test process has threads, and forking it would warn.
    code = (
        "import os\n"
        "from django_rws_jobs.queue.ids import claim_token, worker_id\n"
        "parent = worker_id()\n"
        "read, write = os.pipe()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os.write(write, claim_token().encode())\n"
        "    os._exit(0)\n"
        "os.close(write)\n"
        "os.waitpid(pid, 0)\n"
        "print(os.getpid(), parent, pid, os.read(read, 500).decode(), worker_id())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()\n" + code],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    pid, parent, child_pid, child_token, parent_after = out.stdout.split()
    assert parent.split(":")[1] == pid and parent_after == parent
    assert child_token.split("#")[0] != parent
    assert child_token.split(":")[1] == child_pid


#: Run in a process of its own: the supervisor's wait with its Python part made frequent, and a
#: SIGTERM. Exit 0 when the worker stopped; a handler that set the Event itself could deadlock on
#: the lock the interrupted wait holds, and the process would hang until the test's timeout.
SIGNAL_DURING_WAIT = """
import os, signal, threading
import django
django.setup()
from django_rws_jobs.worker import Worker
w = Worker(threads=1, schedules=False)
w.install_signal_handlers()
for _ in range(20):
    w._signals = 0
    w.shared.stop.clear()
    threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGTERM)).start()
    while not w.shared.stop.wait(0):
        pass
"""


@pytest.mark.django_db(transaction=True)
def test_a_signal_during_the_supervisors_wait_stops_the_worker():
    done = subprocess.run(
        [sys.executable, "-c", SIGNAL_DURING_WAIT], cwd=ROOT, env=subprocess_env(), timeout=60
    )
    assert done.returncode == 0


@pytest.mark.django_db(transaction=True)
def test_a_job_that_finishes_as_the_completer_stops_is_recorded(settings, monkeypatch):
    """A job that finishes after the completer took its last batch is recorded by the shutdown
    (it was neither recorded nor handed back: its row stayed running until its lease expired)."""
    import threading

    from django_rws_jobs import job
    from django_rws_jobs.worker import Worker, keeper

    settings.RWS_JOBS = {"SHUTDOWN_TIMEOUT": 5}
    loop = keeper.LeaseKeeper.loop

    def slow_exit(self):  # a lease renewal under way as the keeper is told to stop
        try:
            loop(self)
        finally:
            time.sleep(0.5)

    monkeypatch.setattr(keeper.LeaseKeeper, "loop", slow_exit)
    worker = Worker(threads=1, schedules=False)

    @job("test.finishes_late")
    def finishes_late(payload: str) -> None:
        while not (worker.shared.stop.is_set() and not worker._threads["rws-completer"].is_alive()):
            time.sleep(0.01)

    try:
        job_id = rws.enqueue("test.finishes_late")
        threading.Timer(1.0, worker.stop).start()
        assert worker.run() == 0
        assert not Job.objects.filter(id=job_id).exists()
        assert worker.shared.stats.done == 1
    finally:
        from django_rws_jobs.queue.registry import registry

        registry.unregister("test.finishes_late")
