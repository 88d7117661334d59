"""Long jobs that survive deploys and crashes: ``current_job().iterate``, ``step``, ``stopping`` and
the checkpoint (running/checkpoints.py). In tick() first; then real worker processes of both pools
with real signals: SIGTERM mid-loop and a restart, kill -9 mid-loop and a restart, an atomic step
killed between its write and its commit, and after it."""

import json
import re
import signal
import time
from collections import Counter

import pytest
from django.db import connection

import django_rws_jobs as rws
from django_rws_jobs import JobInterrupted, current_job
from django_rws_jobs.api.dead_letters import retry
from django_rws_jobs.models import BatchRecord, Job
from tests.conftest import drain
from tests.test_worker import wait_for, workers  # noqa: F401  (a fixture)
from tests.testapp.models import Effect, Item, Run

pytestmark = pytest.mark.django_db(transaction=True)


def make_items(n: int, group: str = "g") -> list[int]:
    Item.objects.bulk_create([Item(group=group, number=i, code=f"c{i}") for i in range(n)])
    return list(Item.objects.filter(group=group).order_by("pk").values_list("pk", flat=True))


def worked(label: str) -> Counter:
    """How many times each item of the job labelled ``label`` was worked on."""
    payloads = Run.objects.filter(kind="item", payload__startswith=f"{label}:").values_list(
        "payload", flat=True
    )
    return Counter(int(p.split(":", 1)[1]) for p in payloads)


def saved(job_id: str) -> dict:
    text = Job.objects.get(id=job_id).checkpoint
    return json.loads(text) if text else {}


def due_now(job_id: str) -> None:
    Job.objects.filter(id=job_id).update(next_run_at=0)


# -- in tick() ---------------------------------------------------------------------------------


def test_a_loop_over_a_queryset_resumes_where_its_attempt_failed():
    pks = make_items(1200)  # three pages of iterate's reads
    job_id = rws.enqueue("test.long_rows", json.dumps({"label": "a", "group": "g", "fail_at": pks[700]}))
    assert rws.tick()
    job = Job.objects.get(id=job_id)
    assert (job.status, job.attempts) == ("pending", 1)
    assert saved(job_id)["cursors"] == {"iterate-1": pks[699]}  # the last item whose body returned
    progress = rws.get_progress(job_id)
    assert (progress.current, progress.total) == (700, 1200)  # reported with no line of the handler's
    due_now(job_id)
    assert rws.tick()
    assert not Job.objects.filter(id=job_id).exists()
    counts = worked("a")
    assert sorted(counts) == pks  # none skipped
    assert {pk: n for pk, n in counts.items() if n != 1} == {pks[700]: 2}  # only the failed one again


def test_a_loop_over_a_function_resumes_from_its_cursor():
    job_id = rws.enqueue("test.long_produced", json.dumps({"label": "f", "count": 50, "fail_at": 20}))
    assert rws.tick()
    assert saved(job_id)["cursors"] == {"iterate-1": 20}  # items 0..19 done: the cursor after 19
    due_now(job_id)
    assert rws.tick()
    counts = worked("f")
    assert sorted(counts) == list(range(50))
    assert {n: c for n, c in counts.items() if c != 1} == {20: 2}


def test_a_step_is_not_run_again_when_the_attempt_fails_after_it():
    job_id = rws.enqueue("test.steps", "card-1")
    assert rws.tick()
    assert saved(job_id)["steps"] == {"charge": {"charged": "card-1"}}
    due_now(job_id)
    assert rws.tick()
    assert list(Run.objects.order_by("id").values_list("kind", "payload")) == [
        ("charge", "card-1"),
        ("receipt", "card-1"),
    ]


@rws.job("tests.long.two_loops", max_retries=2)
def two_loops(payload: str) -> None:
    ctx = current_job()
    for n in ctx.iterate(lambda c: ((i + 1, i) for i in range(c or 0, 5)), name="first"):
        Run.objects.create(kind="first", payload=str(n), pid=0)
    for n in ctx.iterate(lambda c: ((i + 1, i) for i in range(c or 0, 5)), name="second"):
        Run.objects.create(kind="second", payload=str(n), pid=0)
        if n == 2 and ctx.attempt == 1:
            raise ValueError("second loop failed")
    assert ctx.checkpoint["finished"] == ["first", "second"]


def test_a_finished_loop_yields_nothing_when_its_job_resumes():
    job_id = rws.enqueue("tests.long.two_loops", "")
    assert rws.tick()
    assert saved(job_id) == {"steps": {}, "cursors": {"second": 2}, "finished": ["first"]}
    due_now(job_id)
    assert rws.tick()
    assert not Job.objects.filter(id=job_id).exists()
    assert [p for k, p in Run.objects.filter(kind="first").values_list("kind", "payload")] == list("01234")
    assert [p for k, p in Run.objects.filter(kind="second").values_list("kind", "payload")] == list("012234")


@rws.job("tests.long.lost_claim", max_retries=0)
def lost_claim(payload: str) -> None:
    def effect() -> str:
        Effect.objects.create(name="lost")
        with connection.cursor() as c:  # another worker takes the job over, in this transaction
            c.execute("UPDATE rws_jobs SET locked_by = 'someone else' WHERE id = %s", [current_job().id])
        return "written"

    current_job().step("effect", effect, atomic=True)


def test_an_atomic_step_whose_claim_is_gone_writes_nothing():
    job_id = rws.enqueue("tests.long.lost_claim", "")
    assert rws.tick()
    job = Job.objects.get(id=job_id)
    assert job.status == "failed"
    assert "no longer holds job" in job.last_error and "rolled back" in job.last_error
    assert not Effect.objects.exists()  # the step's write rolled back with its result
    assert job.checkpoint is None


@rws.job("tests.long.atomic_ok", max_retries=2)
def atomic_ok(payload: str) -> None:
    ctx = current_job()
    ctx.step("effect", lambda: Effect.objects.create(name=payload).name, atomic=True)
    if ctx.attempt == 1:
        raise ValueError("after the atomic step")


def test_an_atomic_step_commits_once_and_is_skipped_after_a_failure():
    job_id = rws.enqueue("tests.long.atomic_ok", "once")
    assert rws.tick()
    assert saved(job_id)["steps"] == {"effect": "once"}
    due_now(job_id)
    assert rws.tick()
    assert list(Effect.objects.values_list("name", flat=True)) == ["once"]


@rws.job("tests.long.in_transaction", max_retries=0)
def atomic_in_transaction(payload: str) -> None:
    from django.db import transaction

    with transaction.atomic():
        current_job().step("effect", lambda: 1, atomic=True)


def test_an_atomic_step_inside_the_handlers_transaction_is_a_clear_error():
    job_id = rws.enqueue("tests.long.in_transaction", "")
    assert rws.tick()
    assert "inside a transaction" in Job.objects.get(id=job_id).last_error


@pytest.mark.parametrize(
    "case, error",
    [
        ("step_not_json", "TypeError: step('s'): the result must be a JSON value, got <object object"),
        ("step_too_big", "ValueError: step('s'): the result is 70002 bytes of JSON; the limit is 65536"),
        ("unordered", "ValueError: iterate(): the QuerySet is ordered by ['-pk'], not by 'pk' ascending"),
        ("not_unique", "ValueError: iterate(): by='number' is not a unique field of testapp.Item"),
        ("sliced", "ValueError: iterate(): the QuerySet is sliced"),
        ("cursor_not_json", "TypeError: iterate(): a cursor must be a JSON value, got object"),
        ("two_steps", "ValueError: step(): two steps named 's' in one attempt"),
        ("two_loops", "ValueError: iterate(): two loops named 'rows' in one attempt"),
        ("not_iterable", "TypeError: iterate() takes a QuerySet or a function items(cursor)"),
    ],
)
def test_bad_input_is_a_clear_error(case, error):
    make_items(3)
    job_id = rws.enqueue("test.long_bad", case)
    assert rws.tick()
    job = Job.objects.get(id=job_id)
    assert job.status == "failed"
    assert job.last_error.startswith(error), job.last_error


def test_a_bad_checkpoint_fails_its_job_only_and_a_restart_clears_it():
    make_items(3)
    bad = rws.enqueue("test.long_rows", json.dumps({"label": "b", "group": "g"}), max_retries=0)
    Job.objects.filter(id=bad).update(checkpoint="{not json")
    good = rws.enqueue("test.record", "next")
    drain()
    job = Job.objects.get(id=bad)
    assert job.status == "failed" and "checkpoint is not JSON" in job.last_error
    assert not Job.objects.filter(id=good).exists()  # the next job ran
    assert retry(bad, restart=True)
    assert Job.objects.get(id=bad).checkpoint is None
    drain()
    assert sorted(worked("b").values()) == [1, 1, 1]


def test_a_dead_long_job_retried_resumes_from_its_checkpoint_or_restarts():
    pks = make_items(10)
    job_id = rws.enqueue("test.long_rows_dead", json.dumps({"label": "d", "group": "g", "fail_at": pks[6]}))
    assert rws.tick()
    assert Job.objects.get(id=job_id).status == "failed"
    assert saved(job_id)["cursors"] == {"iterate-1": pks[5]}
    assert retry(job_id)  # the attempt is 1 again: the item fails again, after the first six
    assert rws.tick()
    assert worked("d") == Counter({**{pk: 1 for pk in pks[:6]}, pks[6]: 2})
    assert retry(job_id, restart=True)
    job = Job.objects.get(id=job_id)
    assert (job.checkpoint, job.status) == (None, "pending")
    assert rws.tick()
    assert worked("d")[pks[0]] == 2  # from the beginning


@rws.job("tests.long.view")
def view(payload: str) -> None:
    ctx = current_job()
    assert ctx.stopping is False  # tick(): nothing asks it to stop
    assert ctx.step("a", lambda: (1, 2)) == [1, 2]  # the saved JSON's value, the first time too
    seen = ctx.checkpoint
    seen["steps"]["a"] = "changed"  # a copy
    Run.objects.create(kind="view", payload=json.dumps(ctx.checkpoint), pid=0)


def test_the_checkpoint_is_a_read_only_copy():
    rws.enqueue("tests.long.view", "")
    assert rws.tick()
    assert json.loads(Run.objects.get(kind="view").payload) == {
        "steps": {"a": [1, 2]},
        "cursors": {},
        "finished": [],
    }


@rws.job("tests.long.interrupts")
def interrupts(payload: str) -> None:
    current_job().step("before", lambda: "saved")
    try:
        raise JobInterrupted("stopping")
    except Exception:  # a BaseException: a handler's ``except Exception`` does not swallow it
        raise AssertionError("swallowed") from None


def test_a_job_raising_job_interrupted_is_handed_back_uncharged():
    job_id = rws.enqueue("tests.long.interrupts", "")
    assert rws.tick()
    job = Job.objects.get(id=job_id)
    assert (job.status, job.attempts, job.resumptions, job.last_error) == ("pending", 0, 1, None)
    assert saved(job_id)["steps"] == {"before": "saved"}
    assert rws.tick()
    assert Job.objects.get(id=job_id).resumptions == 2


def test_the_admin_shows_the_checkpoint_and_resumptions(admin_client):
    from django.urls import reverse

    job_id = rws.enqueue("tests.long.interrupts", "")
    assert rws.tick()
    page = admin_client.get(reverse("admin:django_rws_jobs_job_change", args=[job_id])).content.decode()
    assert "0 of 4, resumed 1" in page
    assert "&quot;before&quot;: &quot;saved&quot;" in page  # the checkpoint, indented JSON
    listing = admin_client.get(reverse("admin:django_rws_jobs_job_changelist")).content.decode()
    assert "0 of 4, resumed 1" in listing


def test_the_admin_retries_a_dead_long_job_from_the_beginning(admin_client):
    from django.urls import reverse

    from tests.test_outcomes import admin_post, messages_of

    pks = make_items(4)
    job_id = rws.enqueue("test.long_rows_dead", json.dumps({"label": "x", "group": "g", "fail_at": pks[2]}))
    assert rws.tick()
    assert saved(job_id)["cursors"] == {"iterate-1": pks[1]}
    response = admin_post(
        admin_client,
        reverse("admin:django_rws_jobs_failedjob_changelist"),
        {"action": "restart_selected", "index": "0", "_selected_action": [job_id]},
    )
    assert messages_of(response) == [
        "Retried 1 dead job from the beginning, its checkpoint cleared; it is due now."
    ]
    job = Job.objects.get(id=job_id)
    assert (job.status, job.checkpoint, job.attempts) == ("pending", None, 0)


def test_a_django_task_is_handed_back_and_resumes():
    tasks_api = pytest.importorskip("django_rws_jobs.tasks.compat")
    from tests.testapp import tasks

    result = tasks.long_count.enqueue(5)
    assert rws.tick()
    job = Job.objects.get(id=result.id)
    assert (job.status, job.attempts, job.resumptions) == ("pending", 0, 1)
    assert tasks.long_count.get_result(result.id).status == tasks_api.TaskResultStatus.READY
    assert rws.tick()
    assert tasks.long_count.get_result(result.id).return_value == 3  # items 2, 3, 4 this time
    items = Run.objects.filter(kind="task-item").values_list("payload", flat=True)
    assert sorted(items) == ["0", "1", "2", "2", "3", "4"]  # 2 was cut short: it runs again


def test_rust_sees_a_long_job_as_a_plain_row():
    pks = make_items(5)
    job_id = rws.enqueue("test.long_rows", json.dumps({"label": "r", "group": "g", "fail_at": pks[2]}))
    assert rws.tick()
    with connection.cursor() as c:  # the crate's columns only, as its claim reads them
        c.execute("SELECT status, attempts, payload FROM rws_jobs WHERE id = %s", [job_id])
        status, attempts, payload = c.fetchone()
    assert (status, attempts, json.loads(payload)["label"]) == ("pending", 1, "r")


# -- real worker processes ---------------------------------------------------------------------


LONG = {"SHUTDOWN_TIMEOUT": 60, "CHECKPOINT_INTERVAL": 1}


def wait_worked(label: str, n: int, timeout: float = 60) -> None:
    wait_for(lambda: sum(worked(label).values()) >= n, timeout, what=f"{n} items of {label} worked on")


def finish_with_a_new_worker(workers, pool: str, job_id: str, **jobs) -> str:  # noqa: F811
    """Start a worker (the deploy's next one), wait until it has finished the job, stop it."""
    w = workers(
        "--workers", "2", "--pool", pool, "--no-schedules", jobs={**LONG, "POLL_INTERVAL": 0.2, **jobs}
    )
    wait_for(
        lambda: not Job.objects.filter(id=job_id).exists(), 120, what=f"the job to finish:\n{w.output()}"
    )
    w.signal(signal.SIGTERM)
    assert w.wait(60) == 0, w.output()
    return w.output()


@pytest.mark.slow
# Each pool with each kind of loop once across the two tests (CI's time): the loops' code is the
# same in both pools, the stop's path is not.
@pytest.mark.parametrize(
    ("pool", "job_type"), [("processes", "test.long_rows"), ("threads", "test.long_produced")]
)
def test_sigterm_mid_loop_hands_back_at_once_and_a_restart_resumes(workers, pool, job_type):  # noqa: F811
    pks = make_items(200)
    label = f"{job_type}-{pool}"
    args = {"label": label, "group": "g", "count": 200, "sleep": 0.02}
    job_id = rws.enqueue(job_type, json.dumps(args))
    w = workers("--workers", "2", "--pool", pool, "--no-schedules", jobs=LONG)
    wait_worked(label, 20)
    signalled = time.monotonic()
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0, w.output()
    took = time.monotonic() - signalled
    assert took < 5, f"SHUTDOWN_TIMEOUT is 60 s; the worker took {took:.1f} s\n{w.output()}"
    job = Job.objects.get(id=job_id)
    assert (job.status, job.attempts, job.resumptions, job.locked_by) == ("pending", 0, 1, None)
    counts = worked(label)
    assert set(counts.values()) == {1}
    keys = sorted(counts)
    cursor = saved(job_id)["cursors"]["iterate-1"]
    assert cursor == (keys[-1] if job_type == "test.long_rows" else keys[-1] + 1)  # after the last one
    assert "1 handed back to resume" in w.output()
    finish_with_a_new_worker(workers, pool, job_id)
    counts = worked(label)
    assert sorted(counts) == (pks if job_type == "test.long_rows" else list(range(200)))  # none skipped
    assert set(counts.values()) == {1}  # none twice


@pytest.mark.slow
@pytest.mark.parametrize(
    ("pool", "job_type"), [("threads", "test.long_rows"), ("processes", "test.long_produced")]
)
def test_kill_9_mid_loop_resumes_from_a_recent_cursor(workers, pool, job_type, tmp_path):  # noqa: F811
    pks = make_items(300)
    label = f"k-{job_type}-{pool}"
    sleep = 0.02
    args = {"label": label, "group": "g", "count": 300, "sleep": sleep}
    job_id = rws.enqueue(job_type, json.dumps(args))
    fast = {**LONG, "LEASE_SECONDS": 2, "RECOVERY_INTERVAL": 1, "BACKOFF_INITIAL": 0}
    w = workers("--workers", "1", "--pool", pool, "--no-schedules", jobs=fast)
    wait_worked(label, 60)
    w.proc.send_signal(signal.SIGKILL)
    w.proc.wait()
    # A process pool's child ends once it sees its worker gone (a thread of its own waits on the
    # worker's pidfd, then needs the GIL: milliseconds, during which an item may still commit):
    # from half a second on, nothing is worked on any more.
    time.sleep(0.5)
    before = worked(label)
    time.sleep(1.5)
    assert worked(label) == before
    cursor = saved(job_id)["cursors"]["iterate-1"]
    time.sleep(1.5)  # (with the 2 s above) its lease of 2 s runs out: the next worker takes it back
    finish_with_a_new_worker(workers, pool, job_id, **fast)
    counts = worked(label)
    assert sorted(counts) == (pks if job_type == "test.long_rows" else list(range(300)))  # none skipped
    twice = [k for k, n in counts.items() if n > 1]
    assert all(n <= 2 for n in counts.values())
    # The items run again are those after the saved cursor that the killed attempt had worked on:
    # at most CHECKPOINT_INTERVAL (1 s) plus the writer's round (1 s) of them.
    assert len(twice) <= 2.5 / sleep, (len(twice), cursor)
    assert Job.objects.filter(id=job_id).count() == 0


@pytest.mark.slow
@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_stopping_lets_a_loop_of_its_own_hand_its_job_back(workers, pool):  # noqa: F811
    job_id = rws.enqueue("test.own_loop", json.dumps({"label": "own", "chunks": 60, "sleep": 0.05}))
    w = workers("--workers", "1", "--pool", pool, "--no-schedules", jobs=LONG)
    wait_worked("own", 10)
    signalled = time.monotonic()
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0, w.output()
    assert time.monotonic() - signalled < 5
    job = Job.objects.get(id=job_id)
    assert (job.status, job.attempts, job.resumptions) == ("pending", 0, 1)
    finish_with_a_new_worker(workers, pool, job_id)
    assert worked("own") == Counter(dict.fromkeys(range(60), 1))


@pytest.mark.slow
@pytest.mark.parametrize("pool", ["threads", "processes"])
@pytest.mark.parametrize("when", ["before_commit", "after_commit"])
def test_an_atomic_step_killed_around_its_commit_writes_once(workers, pool, when, tmp_path):  # noqa: F811
    marker = tmp_path / "in-step"
    job_id = rws.enqueue("test.atomic_step", json.dumps({"name": when, "marker": str(marker), "when": when}))
    fast = {"LEASE_SECONDS": 3, "RECOVERY_INTERVAL": 1, "BACKOFF_INITIAL": 0}
    w = workers("--workers", "1", "--pool", pool, "--no-schedules", jobs=fast)
    wait_for(marker.exists, 60, what="the handler to reach its pause")
    w.proc.send_signal(signal.SIGKILL)
    w.proc.wait()
    time.sleep(4)  # its lease (3 s) runs out: the next worker takes the job back as it starts
    finish_with_a_new_worker(workers, pool, job_id, **fast)
    assert list(Effect.objects.values_list("name", flat=True)) == [when]  # exactly once
    assert Run.objects.filter(kind="long_done", payload=when).count() == 1


@pytest.mark.slow
@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_a_step_before_a_failure_runs_once_in_a_worker(workers, pool):  # noqa: F811
    job_id = rws.enqueue("test.steps", f"card-{pool}")
    finish_with_a_new_worker(workers, pool, job_id, BACKOFF_INITIAL=0)
    assert list(Run.objects.order_by("id").values_list("kind", "payload")) == [
        ("charge", f"card-{pool}"),
        ("receipt", f"card-{pool}"),
    ]


@pytest.mark.slow
def test_a_fleet_restarted_by_sigterm_runs_every_item_exactly_once(workers):  # noqa: F811
    """Six long jobs on three worker processes (both pools), one of them stopped by SIGTERM every
    second and started again, as a rolling deploy does: every item of every job is worked on
    exactly once, and each job finishes."""
    import random

    pks = make_items(150)
    ids = [
        rws.enqueue("test.long_rows", json.dumps({"label": f"fleet{n}", "group": "g", "sleep": 0.05}))
        for n in range(6)
    ]
    pools = ["threads", "processes", "threads"]
    live = [workers("--workers", "2", "--pool", p, "--no-schedules", jobs=LONG) for p in pools]
    for w in live:
        w.started()  # its signal handlers are set: a SIGTERM before would kill it as any process
    rng = random.Random(11)
    stopped = []
    while Job.objects.filter(id__in=ids).exists() and len(stopped) < 40:
        time.sleep(1)
        n = rng.randrange(len(live))
        victim = live.pop(n)
        victim.signal(signal.SIGTERM)
        assert victim.wait(30) == 0, victim.output()
        stopped.append(victim)
        live.insert(n, workers("--workers", "2", "--pool", pools[n], "--no-schedules", jobs=LONG))
        live[n].started()
    wait_for(lambda: not Job.objects.filter(id__in=ids).exists(), 120, what="every long job to finish")
    for n in range(6):
        assert worked(f"fleet{n}") == Counter(dict.fromkeys(pks, 1)), n
    handed = sum(int(m) for w in stopped for m in re.findall(r"(\d+) handed back to resume", w.output()))
    assert handed >= 3, f"{len(stopped)} stops handed back {handed} jobs: the restarts missed the jobs"


@pytest.mark.slow
def test_a_batch_member_handed_back_stays_outstanding_and_the_batch_finishes_once(workers):  # noqa: F811
    make_items(100)
    with rws.batch(on_finish=rws.call("test.record", "batch finished")) as batch:
        batch.enqueue("test.long_rows", json.dumps({"label": "m", "group": "g", "sleep": 0.05}))
    w = workers("--workers", "1", "--no-schedules", jobs=LONG)
    wait_worked("m", 10)
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0, w.output()
    record = rws.get_batch(batch.id)
    assert (record.state, record.pending, record.succeeded) != ("finished", 0, 1)
    assert record.pending == 1 and record.finished_at is None
    assert not Run.objects.filter(kind="record").exists()  # no callback yet
    w = workers("--workers", "1", "--burst", "--no-schedules", jobs=LONG)
    assert w.wait(120) == 0, w.output()
    assert BatchRecord.objects.get(id=batch.id).state == "finished"
    assert list(Run.objects.filter(kind="record").values_list("payload", flat=True)) == ["batch finished"]
    assert set(worked("m").values()) == {1}
