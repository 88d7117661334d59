"""One clock: workers and web processes whose host clocks are 10 minutes off (Debian's faketime)
keep the database's time for every due time and lease (django_rws_jobs/clock.py)."""

import calendar
import glob
import json
import os
import re
import subprocess
import sys
import time

import pytest
from django.db import connection

import django_rws_jobs as rws
from django_rws_jobs.database import clock
from django_rws_jobs.models import Job, Status
from tests.conftest import ROOT, subprocess_env
from tests.features import db_feature
from tests.test_worker import WorkerProcess, run_counts, wait_for
from tests.testapp.models import Run

#: libfaketime itself, preloaded into the child: the faketime command forks and waits, so killing it
#: would leave the worker running.
LIBFAKETIME = next(iter(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")), None)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.skipif(db_feature("server_clock_sql") is None, reason="SQLite lives in the host's clock"),
    # scripts/test installs faketime; under CI a missing one fails the tests instead of skipping them.
    pytest.mark.skipif(
        not LIBFAKETIME and not os.environ.get("CI"),
        reason="needs Debian's faketime (scripts/test installs it)",
    ),
]

AHEAD, BEHIND = "+10m", "-10m"


def faked_env(shift: str, **jobs) -> dict[str, str]:
    # The wall clock moves; the monotonic clock, which the queue carries the database's time on,
    # does not.
    return subprocess_env(
        RWS_TEST_JOBS=json.dumps(jobs),
        LD_PRELOAD=str(LIBFAKETIME),
        FAKETIME=shift,
        FAKETIME_DONT_FAKE_MONOTONIC="1",
    )


@pytest.fixture
def faked_workers(tmp_path):
    started: list[WorkerProcess] = []

    def start(shift: str | None, *args: str, jobs: dict | None = None) -> WorkerProcess:
        env = (
            {"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME": shift, "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
            if shift
            else None
        )
        w = WorkerProcess(tmp_path, *args, jobs=jobs, name=f"worker{shift or ''}", env=env)
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop()


def database_now() -> float:
    with connection.cursor() as c:
        c.execute(db_feature("server_clock_sql"))
        return float(c.fetchone()[0])


def test_faketime_moves_the_wall_clock_of_a_child():
    """The premise of every test here: the child's time.time() is 10 minutes ahead."""
    out = subprocess.run(
        [sys.executable, "-c", "import time; print(time.time())"],
        env=faked_env(AHEAD),
        capture_output=True,
        text=True,
        check=True,
    )
    assert float(out.stdout) - time.time() == pytest.approx(600, abs=5)


def test_a_fast_clock_worker_takes_no_live_lease_and_charges_nothing(faked_workers):
    job_id = rws.enqueue("test.sleep", "6")
    honest = faked_workers(None, jobs={"LEASE_SECONDS": 20})
    wait_for(lambda: Run.objects.filter(kind="start").exists(), 30, what="the job to start")
    fast = faked_workers(AHEAD, jobs={"LEASE_SECONDS": 20, "RECOVERY_INTERVAL": 0.5})
    fast.started()
    # A host-clock worker 10 minutes ahead sees the lease as expired at start and at every
    # recovery; the database's clock says it has 20 s left.
    time.sleep(2)
    job = Job.objects.get(id=job_id)
    assert (job.status, job.attempts) == (Status.RUNNING, 0), fast.output()
    wait_for(lambda: Run.objects.filter(kind="end").exists(), 30, what="the job to end")
    wait_for(lambda: not Job.objects.filter(id=job_id).exists(), 10, what="the job to be recorded done")
    assert Run.objects.filter(kind="start").count() == 1
    assert "took back" not in fast.output()
    assert "dropped" not in honest.output(), honest.output()
    assert "ahead of the database's" in fast.output(), fast.output()
    assert "check this host's NTP" in fast.output()  # the warning: more than 2 s off


def test_a_fast_clock_worker_does_not_run_a_job_due_in_five_minutes(faked_workers):
    job_id = rws.enqueue("test.record", "later", run_in=300)
    fast = faked_workers(AHEAD, "--burst")
    assert fast.wait(60) == 0, fast.output()
    assert run_counts() == {}
    assert Job.objects.get(id=job_id).status == Status.PENDING


def test_a_slow_clock_worker_runs_a_job_due_now_at_once(faked_workers):
    slow = faked_workers(BEHIND)
    slow.started()
    time.sleep(0.5)
    rws.enqueue("test.record", "now")
    enqueued = time.monotonic()
    wait_for(lambda: run_counts() == {"now": 1}, 30, what=f"the job to run:\n{slow.output()}")
    assert time.monotonic() - enqueued < 3, slow.output()


def test_a_fast_clock_web_process_enqueues_at_the_databases_now():
    code = (
        "import django; django.setup()\n"
        "import django_rws_jobs as rws\n"
        "print(rws.enqueue('test.record', 'now'), rws.enqueue('test.record', 'later', run_in=120))\n"
    )
    before = database_now()
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=faked_env(AHEAD),
        capture_output=True,
        text=True,
        timeout=60,
    )
    after = database_now()
    assert out.returncode == 0, out.stdout + out.stderr
    now_id, later_id = out.stdout.split()
    due_now, due_later = (Job.objects.get(id=i) for i in (now_id, later_id))
    assert int(before) <= due_now.next_run_at <= after + 1
    assert int(before) <= due_now.created_at <= after + 1
    assert int(before) + 120 <= due_later.next_run_at <= after + 121


def test_the_clock_reads_the_database_and_follows_monotonic_time():
    clock.forget()
    reading = clock.read(connection)
    assert reading is not None
    assert abs(reading.offset) < 1  # this machine's clock and its database's agree
    assert clock.now() == pytest.approx(database_now(), abs=0.5)


def test_skewed_workers_fire_each_cron_due_time_once_and_never_early(tmp_path):
    """Two workers 10 minutes ahead and behind tick an every-second schedule: each due second is
    enqueued once, at or after that second by the database's clock."""
    from django_rws_jobs.models import JobSchedule

    first = int(database_now()) + 2
    JobSchedule.objects.create(name="every-second", next_run_at=first, cron="*/1 * * * * *")
    procs = []
    for shift in (AHEAD, BEHIND):
        env = {
            **faked_env(shift),
            "DJANGO_SETTINGS_MODULE": "tests.settings_schedules",
            "RWS_LOG_LEVEL": "INFO",
        }
        log = (tmp_path / f"cron{shift}.log").open("w")
        # Queue "elsewhere" only: the enqueued jobs stay, with the time they were enqueued.
        procs.append(
            subprocess.Popen(
                # -v 2: the enqueues are DEBUG lines
                [sys.executable, "-m", "django", "rws_worker", "--queues", "elsewhere", "-v", "2"],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    try:
        while database_now() < first + 5.5:
            time.sleep(0.1)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(60)
    outputs = [(tmp_path / f"cron{shift}.log").read_text() for shift in (AHEAD, BEHIND)]
    pattern = re.compile(r"schedule 'every-second' due at (\S+) enqueued")
    claimed = sorted(
        calendar.timegm(time.strptime(t, "%Y-%m-%dT%H:%M:%SZ"))
        for out in outputs
        for t in pattern.findall(out)
    )
    assert len(claimed) == len(set(claimed)), f"a due second was enqueued twice: {claimed}"
    assert claimed and claimed[0] == first, (claimed, outputs)
    enqueued = sorted(Job.objects.filter(payload="tick").values_list("created_at", flat=True))
    assert len(enqueued) == len(claimed)
    for due, at in zip(claimed, enqueued, strict=True):
        assert due <= at <= due + 2, (claimed, enqueued)  # never early, and on time
    last = JobSchedule.objects.get(name="every-second").next_run_at
    assert last <= database_now() + 2  # a fast clock did not move the schedule 10 minutes on
    assert len(claimed) >= 4
