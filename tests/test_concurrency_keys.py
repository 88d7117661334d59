"""Per-key concurrency: enqueue(concurrency_key=), the promotion of waiting jobs into their key's
slots, and its bookkeeping through every outcome, on the test run's database."""

import signal
import time
from collections import Counter

import pytest
from django.db import IntegrityError, connection, transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import django_rws_jobs as rws
from django_rws_jobs.database.backends import postgresql
from django_rws_jobs.flow.concurrency_keys import KeySweep, promote
from django_rws_jobs.models import Job
from django_rws_jobs.queue.store import Store
from tests.features import db_feature
from tests.test_limits import most_at_once
from tests.test_worker import WorkerProcess, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

T = 2_000_000_000  # a fixed "now", after every job's due time


def state(key):
    """(status, slot) of the key's jobs, in enqueue order."""
    rows = Job.objects.filter(concurrency_key=key).order_by("created_at", "id")
    return [(j.status, j.concurrency_slot) for j in rows]


def claim(store, n=10, token="w#1"):
    return store.claim(token, T, T + 60, None, n)


# -- enqueue -----------------------------------------------------------------------------------------


def test_a_keyed_job_waits_with_its_types_limit_and_others_stay_pending():
    with transaction.atomic():
        a = rws.enqueue("test.keyed3", "x", concurrency_key="account:1")
        b = rws.enqueue("test.record", "y", concurrency_key="account:1")
        plain = rws.enqueue("test.record", "z")
        rows = {j.id: j for j in Job.objects.all()}
    assert (rows[a].status, rows[a].concurrency_limit, rows[a].concurrency_slot) == ("waiting", 3, None)
    assert (rows[b].status, rows[b].concurrency_limit) == ("waiting", 1)  # no limit set: 1
    assert (rows[plain].status, rows[plain].concurrency_key, rows[plain].concurrency_limit) == (
        "pending",
        None,
        None,
    )


@pytest.mark.parametrize(
    "key, error, message",
    [
        ("", ValueError, "concurrency_key must not be empty"),
        ("k" * 192, ValueError, "concurrency_key 'kkkk.*' is 192 characters; the limit is 191"),
        (42, TypeError, "concurrency_key must be a str, got int 42"),
    ],
)
def test_a_bad_concurrency_key_is_refused_naming_it(key, error, message):
    with pytest.raises(error, match=message):
        rws.enqueue("test.record", concurrency_key=key)
    with pytest.raises(error, match="job #0: " + message):
        rws.enqueue_many([{"job_type": "test.record", "concurrency_key": key}])
    assert not Job.objects.exists()


@pytest.mark.parametrize("limit", [0, 100_001, "2", True])
def test_a_bad_concurrency_limit_is_refused_at_registration(limit):
    with pytest.raises((TypeError, ValueError), match=r"job_type 'x': concurrency_limit"):
        rws.register("x", lambda payload: None, concurrency_limit=limit)
    from django_rws_jobs.queue.registry import registry

    assert "x" not in registry


def test_enqueue_many_items_take_a_concurrency_key():
    ids = rws.enqueue_many(
        [
            {"job_type": "test.keyed2", "concurrency_key": "k"},
            {"job_type": "test.record"},
            {"job_type": "test.keyed2", "concurrency_key": "k"},
        ]
    )
    rows = {j.id: j for j in Job.objects.all()}
    assert [(rows[i].status, rows[i].concurrency_key, rows[i].concurrency_limit) for i in ids] == [
        ("waiting", "k", 2),
        ("pending", None, None),
        ("waiting", "k", 2),
    ]


# -- promotion -------------------------------------------------------------------------------------


def test_a_job_of_a_free_key_is_pending_once_enqueued():
    """enqueue promotes its job at commit when the key has a free slot, so that it needs no sweep
    (which may be many busy keys away: benchmarks/keys.py); inside a transaction it waits until
    the commit."""
    first = rws.enqueue("test.keyed2", "1", concurrency_key="k")
    assert state("k") == [("pending", 0)]
    with transaction.atomic():
        second = rws.enqueue("test.keyed2", "2", concurrency_key="k")
        assert Job.objects.get(id=second).status == "waiting"
    third = rws.enqueue("test.keyed2", "3", concurrency_key="k")
    later = rws.enqueue("test.keyed2", "later", concurrency_key="other", run_in=3600)
    assert {j.id: (j.status, j.concurrency_slot) for j in Job.objects.all()} == {
        first: ("pending", 0),
        second: ("pending", 1),
        third: ("waiting", None),  # the key is at its limit of 2
        later: ("waiting", None),  # not due yet: the sweep promotes it when it is
    }


def test_promotion_fills_the_free_slots_in_claim_order():
    store = Store(connection)
    with transaction.atomic():  # (enqueue's own promotion waits for the commit)
        low = [rws.enqueue("test.keyed2", str(i), concurrency_key="k") for i in range(3)]
        high = rws.enqueue("test.keyed2", "high", concurrency_key="k", priority=5)
        later = rws.enqueue("test.keyed2", "later", concurrency_key="k", priority=9, run_in=3600)
        assert promote(store, ["k"], int(time.time()), in_transaction=True) == 2
    pending = Job.objects.filter(status="pending")
    assert {j.id: j.concurrency_slot for j in pending} == {high: 0, low[0]: 1}  # not yet due: left
    assert promote(store, ["k"], int(time.time())) == 0  # the key is at its limit
    assert Job.objects.get(id=later).status == "waiting"


def test_the_database_refuses_a_second_job_in_a_taken_slot():
    """The invariant does not rest on the promotion's reading: two jobs of one key in one slot
    break the unique constraint, whichever process writes them."""
    a = rws.enqueue("test.keyed2", "a", concurrency_key="k")
    b = rws.enqueue("test.keyed2", "b", concurrency_key="k")
    Job.objects.filter(id=a).update(status="pending", concurrency_slot=0)
    with pytest.raises(IntegrityError):
        Job.objects.filter(id=b).update(status="pending", concurrency_slot=0)
    # Another key's slot 0, and rows without a key, never conflict.
    c = rws.enqueue("test.keyed2", "c", concurrency_key="other")
    Job.objects.filter(id=c).update(status="pending", concurrency_slot=0)
    assert Job.objects.filter(concurrency_slot=0).count() == 2


def test_each_way_out_of_running_frees_the_slot_once_and_promotes_the_next(monkeypatch):
    # Slots, not the claim's order: on PostgreSQL a claim slower than SLOW_CLAIM (a cold cache, a
    # loaded machine) makes the next ones resume after the last claimed row, where the job handed
    # back below is not looked for until the point expires (tests/test_tick.py pins that).
    monkeypatch.setattr(postgresql, "SLOW_CLAIM", 60.0)
    store = Store(connection)
    ids = [rws.enqueue("test.keyed", str(i), concurrency_key="k", max_retries=1) for i in range(4)]
    KeySweep().sweep(store, T)
    assert state("k") == [("pending", 0)] + [("waiting", None)] * 3

    (job,) = claim(store)
    assert (job.id, job.concurrency_key) == (ids[0], "k")
    assert claim(store) == []  # the key's other jobs wait: nothing else is pending
    assert store.reschedule(job, 1, "boom", None, T)  # a retry, due at T: behind the others
    assert state("k")[0] == ("waiting", None)
    promote(store, ["k"], T)
    (job,) = claim(store)
    assert job.id == ids[1]
    assert store.move_to_dead_letters(job, 2, "boom", None, T)
    assert state("k")[1] == ("failed", None)
    promote(store, ["k"], T)
    (job,) = claim(store)
    assert job.id == ids[2]
    assert store.release(job)  # a hand back: waiting again, first in claim order
    assert state("k")[2] == ("waiting", None)
    promote(store, ["k"], T)
    (job,) = claim(store)
    assert job.id == ids[2]
    done = store.complete_many([job])
    assert done == {ids[2]}
    store.promote_freed([job], done, T)
    assert state("k") == [("waiting", None), ("failed", None), ("pending", 0)]
    assert promote(store, ["k"], T) == 0  # nothing was freed twice


def test_recovery_of_a_lost_worker_frees_its_slot_and_promotes_the_next():
    from django_rws_jobs.attempts.outcomes import recover

    store = Store(connection)
    first = rws.enqueue("test.keyed", "a", concurrency_key="k", max_retries=0)
    second = rws.enqueue("test.keyed", "b", concurrency_key="k")
    KeySweep().sweep(store, T)
    claim(store)  # its holder dies: the lease runs out at T + 60
    assert recover(store, now=T + 61) == 1
    assert Job.objects.get(id=first).status == "failed"
    assert (Job.objects.get(id=second).status, Job.objects.get(id=second).concurrency_slot) == ("pending", 0)


def test_an_operators_retry_puts_a_keyed_job_back_waiting():
    store = Store(connection)
    job_id = rws.enqueue("test.keyed", "a", concurrency_key="k", max_retries=0)
    KeySweep().sweep(store, T)
    (job,) = claim(store)
    store.move_to_dead_letters(job, 1, "boom", None, T)
    assert rws.retry(job_id)
    assert state("k") == [("waiting", None)]


def test_tick_runs_the_jobs_of_a_key_one_at_a_time_and_others_meanwhile():
    from tests.testapp.models import Run

    for i in range(3):
        rws.enqueue("test.keyed", f"k-{i} 0", concurrency_key="k")
    rws.enqueue("test.record", "plain")
    ran = 0
    while rws.tick():
        ran += 1
    assert ran == 4 and not Job.objects.exists()
    assert sorted(Run.objects.filter(kind="start").values_list("payload", flat=True)) == [
        "k-0",
        "k-1",
        "k-2",
    ]


def busy_keys(n, *, queue="default", prefix="busy"):
    """``n`` keys whose only slot a running job holds (for a worker far away: a lease of a day),
    each with a due job waiting for it."""
    now = int(time.time())
    rows = []
    for i in range(n):
        key = f"{prefix}-{i:04d}"
        common = dict(
            job_type="test.keyed", next_run_at=now, created_at=now, queue=queue, concurrency_key=key
        )
        holder = dict(concurrency_slot=0, locked_by="far:away#1", locked_until=now + 86400)
        rows.append(Job(id=f"{key}-holder", status="running", concurrency_limit=1, **holder, **common))
        rows.append(Job(id=f"{key}-waiting", status="waiting", concurrency_limit=1, **common))
    Job.objects.bulk_create(rows)


def a_waiting_job(key, payload):
    """A due job of ``key`` that nobody has promoted yet (as a retry is once its backoff ends)."""
    now = int(time.time())
    Job.objects.create(
        id=f"job-{key}",
        job_type="test.record",
        payload=payload,
        status="waiting",
        next_run_at=now,
        created_at=now,
        concurrency_key=key,
        concurrency_limit=1,
    )


def test_tick_promotes_a_free_key_past_many_busy_ones(runs):
    busy_keys(150)
    a_waiting_job("zzz", "free")
    assert rws.tick() is True and runs() == [("record", "free")]


def test_the_sweep_walks_every_key_page_by_page_and_starts_again(monkeypatch):
    monkeypatch.setattr(KeySweep, "KEYS_PER_SWEEP", 10)
    store = Store(connection)
    busy_keys(25)
    a_waiting_job("zzz", "free")
    sweep = KeySweep()
    assert [sweep.sweep(store, T) for _ in range(3)] == [0, 0, 1]  # keys 0-9, 10-19, 20-24 and zzz
    assert state("zzz") == [("pending", 0)]
    a_waiting_job("aaa", "first")  # before the cursor, which is past the last key: the next sweep
    assert sweep.sweep(store, T) == 1 and state("aaa") == [("pending", 0)]
    a_waiting_job("zzzz", "last")
    assert KeySweep().sweep_all(store, T) == 1 and state("zzzz") == [("pending", 0)]


@pytest.mark.slow
def test_a_burst_worker_exits_past_keys_it_cannot_serve(tmp_path, started):
    """A --burst worker waits for a job it serves whose key a running job holds, and for no other
    waiting job: one in a queue it does not serve, or in a paused one."""
    busy_keys(1, queue="b", prefix="b")
    rws.enqueue("test.record", "served", queue="a")
    waits = WorkerProcess(tmp_path, "--burst", "--queues", "b", name="b")
    started.append(waits)
    other = WorkerProcess(tmp_path, "--burst", "--queues", "a", name="a")
    started.append(other)
    assert other.wait(30) == 0, other.output()
    rws.pause_queue("p")
    busy_keys(1, queue="p", prefix="p")
    paused = WorkerProcess(tmp_path, "--burst", "--queues", "a,p", name="paused")
    started.append(paused)
    assert paused.wait(30) == 0, paused.output()
    assert waits.proc.poll() is None, waits.output()  # its job still waits for the running one
    waits.signal(signal.SIGTERM)
    assert waits.wait(30) == 0


def test_a_cron_entry_takes_a_concurrency_key(settings):
    from django_rws_jobs.schedules.ticks import tick_schedules

    settings.RWS_JOBS = {
        **settings.RWS_JOBS,
        "SCHEDULES": {"sync": {"cron": "* * * * * *", "job_type": "test.keyed", "concurrency_key": "sync"}},
    }
    t = int(time.time())
    tick_schedules(now=t)  # the schedule's first due time: t + 1
    assert tick_schedules(now=t + 1) == 1
    assert [(j.status, j.concurrency_key, j.concurrency_slot) for j in Job.objects.all()] == [
        ("pending", "sync", 0)  # its key is free: promoted at enqueue
    ]


# -- the bookkeeping against a model ----------------------------------------------------------------

KEYS = ("a", "b")
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("enqueue"), st.sampled_from(KEYS)),
        st.tuples(st.just("sweep"), st.just("")),
        st.tuples(st.just("claim"), st.integers(1, 4).map(str)),
        st.tuples(st.just("finish"), st.sampled_from(["complete", "retry", "dead", "release"])),
        st.tuples(st.just("crash"), st.just("")),  # the holder dies; recovery takes its jobs back
        st.tuples(st.just("retry_dead"), st.just("")),
        st.tuples(st.just("delete_waiting"), st.just("")),
    ),
    max_size=30,
)


def check_slots(limits):
    """Every pending or running job of a key holds a slot below its limit, no two the same one,
    and no waiting or failed job holds one."""
    for key, limit in limits.items():
        rows = list(Job.objects.filter(concurrency_key=key).values_list("status", "concurrency_slot"))
        slots = [slot for status, slot in rows if status in ("pending", "running")]
        assert None not in slots and len(set(slots)) == len(slots) <= limit
        assert all(0 <= s < limit for s in slots)
        assert all(slot is None for status, slot in rows if status in ("waiting", "failed"))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, limit=st.integers(1, 3))
def test_the_slots_match_a_model_whatever_the_interleaving(ops, limit):
    """Enqueues, sweeps, claims, outcomes, a crash and recovery, an operator's retry and
    deletion in any order: no key ever has more slots taken than its limit or two jobs in one
    slot (none doubled), and a sweep fills every free slot that has a due job waiting (none
    leaked)."""
    from django_rws_jobs.attempts.outcomes import recover

    job_type = {1: "test.keyed", 2: "test.keyed2", 3: "test.keyed3"}[limit]
    Job.objects.all().delete()
    store = Store(connection)
    held: list = []
    n = 0
    now = T
    for op, arg in ops:
        if op == "enqueue":
            rws.enqueue(job_type, "", concurrency_key=arg, max_retries=1)
        elif op == "sweep":
            KeySweep().sweep(store, now)
            for key in KEYS:  # none leaked: a key with a waiting job has every slot taken
                if Job.objects.filter(concurrency_key=key, status="waiting", next_run_at__lte=now).exists():
                    taken = Job.objects.filter(concurrency_key=key, concurrency_slot__isnull=False).count()
                    assert taken == limit
        elif op == "claim":
            n += 1
            held += store.claim(f"w#{n}", now, now + 60, None, int(arg))
        elif op == "finish" and held:
            job = held.pop(0)
            if arg == "complete":
                done = store.complete_many([job])
                store.promote_freed([job], done, now)
            elif arg == "retry":
                assert store.reschedule(job, 1, "boom", None, now)
            elif arg == "dead":
                assert store.move_to_dead_letters(job, 1, "boom", None, now)
            else:
                assert store.release(job)
        elif op == "crash":
            held = []
            now += 61  # the leases ran out
            recover(store, now=now)
        elif op == "retry_dead":
            for job in Job.objects.filter(status="failed"):
                rws.retry(job.id, now=now)
        elif op == "delete_waiting":
            for job in Job.objects.filter(status="waiting")[:1]:
                rws.delete(job.id)
        check_slots(dict.fromkeys(KEYS, limit))
        assert Job.objects.filter(status="running").count() == len(held)


# -- real workers ------------------------------------------------------------------------------------

LIMITS = {"test.keyed": 1, "test.keyed2": 2, "test.keyed3": 3}


@pytest.mark.slow
def test_keys_hold_their_limits_across_worker_processes(tmp_path, started):
    """600 jobs over six keys with limits 1, 2 and 3 and 200 without a key, on 6 workers x 4
    threads: no key ever has more jobs between their start and end traces than its limit, each
    job runs once, and the jobs without a key run meanwhile."""
    from tests.testapp.models import Run

    items = []
    for i in range(100):
        for job_type, limit in LIMITS.items():
            for key in ("a", "b"):
                label = f"key-{limit}{key}-{i}"
                items.append(
                    {"job_type": job_type, "payload": f"{label} 0.01", "concurrency_key": f"{limit}{key}"}
                )
    items += [{"job_type": "test.span", "payload": f"plain-{i} 0.01"} for i in range(200)]
    rws.enqueue_many(items)
    for _ in range(6):
        started.append(WorkerProcess(tmp_path, "--workers", "4", "--burst", jobs={"POLL_INTERVAL": 0.2}))
    for w in started:
        assert w.wait(240) == 0, w.output()
    assert not Job.objects.exists()
    labels = Counter(Run.objects.values_list("kind", "payload"))
    assert set(labels.values()) == {1} and len(labels) == 2 * 800  # each job's start and end, once
    for limit in (1, 2, 3):
        for key in ("a", "b"):
            assert most_at_once(f"key-{limit}{key}-") <= limit, (limit, key)
    assert max(most_at_once("key-3a-"), most_at_once("key-3b-")) >= 2  # the limit is used, not 1
    # Jobs without a key ran while the keys' queues were still long: the last plain job ended
    # before the last job of a limit-1 key did.
    last = {
        prefix: Run.objects.filter(kind="end", payload__startswith=prefix).latest("at", "id").at
        for prefix in ("plain-", "key-1a-", "key-1b-")
    }
    assert last["plain-"] < min(last["key-1a-"], last["key-1b-"])


@pytest.mark.slow
def test_kill_9_of_the_worker_holding_a_keys_only_slot_frees_it_by_recovery(tmp_path, started):
    """The job holding a key's only slot loses its worker to kill -9: recovery takes it back
    (dead: no retries left), and the key's next job starts within LEASE_SECONDS and a few
    seconds."""
    from tests.testapp.models import Run

    fast = {"LEASE_SECONDS": 3, "RECOVERY_INTERVAL": 0.5, "POLL_INTERVAL": 0.2}
    stuck = rws.enqueue("test.keyed", "stuck 600", concurrency_key="k", max_retries=0)
    rws.enqueue("test.keyed", "next 0", concurrency_key="k")
    victim = WorkerProcess(tmp_path, "--workers", "2", jobs=fast)
    started.append(victim)
    wait_for(
        lambda: Run.objects.filter(kind="start", payload="stuck").exists(), what="the first job to start"
    )
    rescuer = WorkerProcess(tmp_path, "--workers", "2", jobs=fast)
    started.append(rescuer)
    rescuer.started()
    time.sleep(1)
    assert not Run.objects.filter(payload="next").exists()  # the key's slot is held
    victim.signal(signal.SIGKILL)
    killed = time.monotonic()
    victim.proc.wait()
    wait_for(lambda: Run.objects.filter(kind="end", payload="next").exists(), timeout=30, what="the next job")
    took = time.monotonic() - killed
    assert took < 3 + 4, took
    assert Job.objects.get(id=stuck).status == "failed"
    assert Run.objects.filter(kind="start", payload="stuck").count() == 1


@pytest.mark.slow
@pytest.mark.skipif(db_feature("wakeup") == "poll", reason="needs a wake-up (NOTIFY, PRAGMA data_version)")
def test_a_keyed_job_wakes_an_idle_worker_at_once(tmp_path, started):
    """The enqueue's wake-up hint makes the idle worker sweep the keys, however recent its last
    sweep: with a poll interval far longer than the bound, the job still starts at once."""
    from tests.testapp.models import Run

    w = WorkerProcess(tmp_path, jobs={"POLL_INTERVAL": 5})
    started.append(w)
    w.started()
    time.sleep(1.5)  # past the start-up: the worker waits out its poll interval
    # A plain job's hint wakes it for a round that sweeps (its last sweep is over a second old);
    # the keyed job comes within the second after, when a round would not sweep for staleness.
    rws.enqueue("test.span", "plain 0")
    wait_for(lambda: Run.objects.filter(kind="end", payload="plain").exists(), 10, what=w.output())
    enqueued = time.monotonic()
    rws.enqueue("test.keyed", "woken 0", concurrency_key="k")
    wait_for(lambda: Run.objects.filter(kind="end", payload="woken").exists(), 10, what=w.output())
    assert time.monotonic() - enqueued < 1.5, w.output()
