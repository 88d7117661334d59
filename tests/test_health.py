"""rws_health: exit 0 healthy, 1 not, one line why (or JSON); the heartbeat file needs no database."""

import io
import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest
from django.core.management import call_command
from django.db import connection, connections

import django_rws_jobs as rws
from django_rws_jobs.models import Job
from django_rws_jobs.operations.worker_rows import Registration, this_host
from django_rws_jobs.queue.store import Store
from tests.conftest import ROOT, subprocess_env
from tests.test_worker import WorkerProcess, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def health(*args):
    """(exit code, what it printed)."""
    out = io.StringIO()
    try:
        call_command("rws_health", *args, stdout=out)
        code = 0
    except SystemExit as exc:
        code = exc.code
    return code, out.getvalue().strip()


def test_healthy_when_the_database_answers_and_the_migrations_are_applied():
    code, line = health()
    assert code == 0 and line == "healthy: database 'default' answers; migrations applied"


def test_due_and_dead_thresholds():
    now = int(time.time())
    for i in range(3):
        rws.enqueue("test.record", str(i))
    Job.objects.filter(payload="0").update(next_run_at=now - 100)
    rws.enqueue("test.record", "later", run_in=3600)
    assert health("--max-due", "3")[0] == 0
    assert health("--max-due", "2") == (1, "unhealthy: more than 2 due job(s), over --max-due 2")
    assert health("--max-due-age", "200")[0] == 0
    code, line = health("--max-due-age", "50")
    assert code == 1 and "the oldest due job waited 10" in line and "over --max-due-age 50" in line
    Job.objects.filter(payload="1").update(status="failed")
    assert health("--max-failed", "1")[0] == 0
    assert health("--max-failed", "0") == (1, "unhealthy: more than 0 dead job(s), over --max-failed 0")
    code, text = health("--max-failed", "0", "--max-due", "5", "--json")
    out = json.loads(text)
    assert code == 1 and out["healthy"] is False and out["checks"]["max_due"]["ok"] is True
    assert out["reason"] == "unhealthy: more than 0 dead job(s), over --max-failed 0"


def stall_a_key(due_ago: int) -> str:
    """Two jobs of key 'k': the first promoted, claimed and failed by rust-web-server's SQL (which
    knows no slots, so its row keeps the key's only slot for ever), the second waiting, due
    ``due_ago`` seconds ago. Returns the waiting job's id."""
    from django_rws_jobs.flow.concurrency_keys import promote

    now = int(time.time())
    first = rws.enqueue("test.keyed", "first", concurrency_key="k")
    second = rws.enqueue("test.keyed", "second", concurrency_key="k")
    Job.objects.filter(id__in=[first, second]).update(next_run_at=now - due_ago)
    promote(Store(connection), ["k"], now)  # (enqueue promoted the first at its commit)
    assert Job.objects.get(id=first).status == "pending"
    with connection.cursor() as c:  # the seed's claim, then its move to the dead-letter list
        c.execute("UPDATE rws_jobs SET status = 'running' WHERE id = %s AND status = 'pending'", [first])
        c.execute(
            "UPDATE rws_jobs SET status = 'failed', attempts = %s, last_error = %s WHERE id = %s",
            [4, "x", first],
        )
    assert Job.objects.get(id=first).concurrency_slot == 0
    assert Job.objects.get(id=second).status == "waiting"
    return second


def test_a_waiting_job_whose_key_stays_full_is_due():
    stall_a_key(due_ago=100)
    code, line = health("--max-due-age", "50")
    assert code == 1, line
    assert "the oldest due job waited 10" in line and "over --max-due-age 50" in line, line
    assert "waiting for a slot of concurrency key 'k'" in line, line
    assert health("--max-due-age", "200")[0] == 0
    assert health("--max-due", "0") == (1, "unhealthy: more than 0 due job(s), over --max-due 0")
    assert health("--max-due", "1")[0] == 0


def test_paused_queues_are_left_out_of_due_unless_asked():
    now = int(time.time())
    held = rws.enqueue("test.record", "held", queue="mail")
    Job.objects.filter(id=held).update(next_run_at=now - 100)
    rws.enqueue("test.record", "on time")  # queue 'default', due now
    rws.pause_queue("mail")
    code, line = health("--max-due-age", "50", "--max-due", "1")
    assert code == 0, line
    assert "paused queues left out: mail" in line, line
    code, line = health("--max-due-age", "50", "--include-paused")
    assert code == 1 and "over --max-due-age 50" in line and "queue 'mail'" in line, line
    assert health("--max-due", "1", "--include-paused")[0] == 1
    rws.resume_queue("mail")
    assert health("--max-due-age", "50")[0] == 1


def test_worker_needs_a_live_worker_of_this_host():
    assert health("--worker") == (1, f"unhealthy: no live worker registered on {this_host()}")
    store = Store(connection)
    me = Registration("x:1:a", None, "threads", 1, 1.0)
    me.register(store, int(time.time()) - 10)  # dead: three intervals passed
    assert health("--worker")[0] == 1
    me.beat(store, int(time.time()), [], 0, 0)
    assert health("--worker") == (
        0,
        f"healthy: database 'default' answers; migrations applied; 1 live worker(s) on {this_host()}",
    )


def test_blocked_jobs_and_open_batches_thresholds():
    from django_rws_jobs.models import BatchRecord

    first = rws.enqueue("test.record", "first", run_in=3600)
    rws.enqueue("test.record", "a", after=[first])
    rws.enqueue("test.record", "b", after=[first])
    assert health("--max-blocked", "2")[0] == 0
    assert health("--max-blocked", "1") == (1, "unhealthy: more than 1 blocked job(s), over --max-blocked 1")
    assert health("--max-open-batch-age", "60") == (
        0,
        "healthy: database 'default' answers; migrations applied; no batch is open",
    )
    with rws.batch() as b:
        BatchRecord.objects.filter(id=b.id).update(created_at=int(time.time()) - 600)
        code, line = health("--max-open-batch-age", "60")
        assert (
            code == 1 and f"batch {b.id} has been open 60" in line and "over --max-open-batch-age 60" in line
        )
        assert health("--max-open-batch-age", "3600")[0] == 0
    assert health("--max-open-batch-age", "60")[0] == 0  # sealed (and finished) now


@contextmanager
def locked_by_another_transaction(job_id):
    """``job_id``'s row locked FOR UPDATE by a transaction of another connection while the block
    runs (as a worker's claim left open by a client that is gone)."""
    other = connections.create_connection(connection.alias)
    try:
        other.set_autocommit(False)
        with other.cursor() as c:
            c.execute("SELECT id FROM rws_jobs WHERE id = %s FOR UPDATE", [job_id])
        yield
    finally:
        other.rollback()
        other.close()


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite locks the whole file, never a row")
def test_a_due_job_a_transaction_keeps_locked_is_unhealthy():
    """Every claim skips a row another transaction holds (SKIP LOCKED): a pending job due for over
    a lease that stays locked is reported, with its queue; one due for less is not yet."""
    now = int(time.time())
    stuck = rws.enqueue("test.record", "stuck", queue="q1")
    rws.enqueue("test.record", "free")
    Job.objects.update(next_run_at=now - 2 * 60)  # due for two leases
    recent = rws.enqueue("test.record", "recent", queue="q1")
    fine = "healthy: database 'default' answers; migrations applied; "
    assert health("--max-locked-due", "0") == (
        0,
        fine + "0 due job(s) locked by a transaction for over a lease",
    )
    with locked_by_another_transaction(stuck), locked_by_another_transaction(recent):
        assert health("--max-locked-due", "0") == (
            1,
            "unhealthy: 1 due job(s) locked by a transaction for over a lease, over --max-locked-due 0 "
            "(queues 'q1': 1; a transaction holds them: see docs/howto/databases.md)",
        )
        assert health("--max-locked-due", "1")[0] == 0
    assert health("--max-locked-due", "0")[0] == 0


def test_bad_thresholds_are_refused_naming_them():
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="--max-due-age -1.0 must be a number of seconds >= 0"):
        call_command("rws_health", "--max-due-age", "-1")
    with pytest.raises(CommandError, match="--max-open-batch-age -5.0 must be a number of seconds >= 0"):
        call_command("rws_health", "--max-open-batch-age", "-5")
    with pytest.raises(CommandError, match="argument --max-due: invalid _non_negative value: '-3'"):
        call_command("rws_health", "--max-due", "-3")


@pytest.mark.slow
def test_unapplied_migrations_are_unhealthy():
    from django.db.migrations.loader import MigrationLoader

    graph = MigrationLoader(connection).graph
    (last,) = graph.leaf_nodes("django_rws_jobs")
    (before,) = graph.node_map[last].parents
    call_command("migrate", "django_rws_jobs", before[1], verbosity=0)
    try:
        code, line = health()
        assert code == 1 and line == f"unhealthy: migrations not applied: {last[1]} (manage.py migrate)"
    finally:
        call_command("migrate", "django_rws_jobs", verbosity=0)
    assert health()[0] == 0


def unreachable_database_env() -> dict[str, str]:
    """This test run's settings, with the database somewhere nothing answers."""
    return subprocess_env(
        RWS_TEST_DB_NAME="/nonexistent/dir/queue.sqlite3" if connection.vendor == "sqlite" else "rws_nope",
        PGPORT="1",
        MYSQL_PORT="1",
    )


def probe(*args: str, env: dict[str, str]) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "django", "rws_health", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, (done.stdout + done.stderr).strip()


@pytest.mark.slow
def test_the_heartbeat_file_tells_a_live_worker_without_the_database(tmp_path, started):
    """A probe with --heartbeat-file alone passes while its database is unreachable and the
    worker lives, and fails once the worker has been dead for three heartbeats."""
    beat = tmp_path / "worker.alive"
    w = WorkerProcess(tmp_path, "--heartbeat-file", str(beat), jobs={"LEASE_SECONDS": 3})
    started.append(w)
    w.started()
    wait_for(beat.exists, 10, what=w.output())
    env = {**unreachable_database_env(), "RWS_TEST_JOBS": json.dumps({"LEASE_SECONDS": 3})}
    code, line = probe("--heartbeat-file", str(beat), env=env)
    assert code == 0 and line.startswith("healthy: heartbeat file"), line
    assert (
        probe("--heartbeat-file", str(beat), "--max-due", "5", env=env)[0] == 1
    )  # that one asks the database
    time.sleep(2.5)  # the worker keeps touching it
    assert probe("--heartbeat-file", str(beat), env=env)[0] == 0
    w.signal(signal.SIGKILL)
    w.proc.wait()
    killed = time.monotonic()
    time.sleep(max(3.5 - (time.monotonic() - killed), 0))  # three intervals of 1 s, and a margin
    code, line = probe("--heartbeat-file", str(beat), env=env)
    assert code == 1 and "three heartbeats" in line, line
    os.unlink(beat)
    code, line = probe("--heartbeat-file", str(beat), env=env)
    assert code == 1 and "No such file" in line, line


@pytest.mark.slow
def test_the_heartbeat_file_goes_stale_while_a_role_is_stuck(tmp_path, started, settings):
    """A live worker whose dispatcher is stuck on a lock stops touching the file, so the probe
    fails while the process lives; once the lock is gone, the file is fresh again. The lock: the
    test's row lock on a waiting job that the dispatcher's sweep promotes (its UPDATE waits for
    it), or on SQLite the file's write lock, which every writer waits for. The lock is held on a
    connection of Django's, as a project's transaction: the server ends an idle transaction of
    the worker's own connections after a lease (base.idle_transaction_seconds)."""
    from tests.testapp.models import Run

    settings.RWS_JOBS = {**settings.RWS_JOBS, "LEASE_SECONDS": 3}  # the probe's limit: 3 s
    beat = tmp_path / "worker.alive"
    w = WorkerProcess(tmp_path, "--heartbeat-file", str(beat), jobs={"LEASE_SECONDS": 3})
    started.append(w)
    w.started()
    wait_for(lambda: health("--heartbeat-file", str(beat))[0] == 0, 10, what=w.output())
    job_id = rws.enqueue("test.keyed", "k 0", concurrency_key="k", run_in=2)  # not due yet
    holder = connections.create_connection("default")
    try:
        with holder.cursor() as c:
            if connection.vendor == "sqlite":
                c.execute("BEGIN IMMEDIATE")
            else:
                c.execute("BEGIN")
                c.execute("SELECT id FROM rws_jobs WHERE id = %s FOR UPDATE", [job_id])
            wait_for(
                lambda: health("--heartbeat-file", str(beat))[0] == 1,
                30,
                what=f"the heartbeat file to go stale:\n{w.output()}",
            )
            assert w.proc.poll() is None
            assert "rws-dispatcher's last turn began" in w.output(), w.output()
            c.execute("ROLLBACK")
        wait_for(
            lambda: health("--heartbeat-file", str(beat))[0] == 0,
            60,
            what=f"the heartbeat file to be fresh again:\n{w.output()}",
        )
        wait_for(lambda: Run.objects.filter(payload="k").exists(), 30, what=f"the job:\n{w.output()}")
    finally:
        holder.close()


@pytest.mark.slow
def test_the_heartbeat_file_stays_fresh_while_the_worker_waits_by_design(tmp_path, started, settings):
    """Waits by design are progress: the one executor busy with a job three bounds long (the
    dispatcher waits for it), then an idle poll interval longer than the bound, and the scheduler,
    which has no schedules, all along. LEASE_SECONDS 3: the bound and the probe's limit, 3 s."""
    from tests.testapp.models import Run

    settings.RWS_JOBS = {**settings.RWS_JOBS, "LEASE_SECONDS": 3}
    beat = tmp_path / "worker.alive"
    w = WorkerProcess(tmp_path, "--heartbeat-file", str(beat), jobs={"LEASE_SECONDS": 3, "POLL_INTERVAL": 10})
    started.append(w)
    w.started()
    wait_for(lambda: health("--heartbeat-file", str(beat))[0] == 0, 10, what=w.output())

    def fresh_until(done, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, f"timed out:\n{w.output()}"
            code, line = health("--heartbeat-file", str(beat))
            assert code == 0, f"{line}\n{w.output()}"
            time.sleep(0.2)

    rws.enqueue("test.sleep", "9")
    wait_for(lambda: Run.objects.filter(kind="start").exists(), 30, what=w.output())
    fresh_until(lambda: Run.objects.filter(kind="end").exists())
    # Idle: the next job is due in 5 s, and the dispatcher looks at it now (enqueue's hint), then
    # again after its poll interval (10 s) unless another hint comes first.
    rws.enqueue("test.record", "next", run_in=5)
    fresh_until(lambda: Run.objects.filter(kind="record", payload="next").exists())
    assert "no longer touched" not in w.output()
