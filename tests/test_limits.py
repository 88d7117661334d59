"""Queue limits (RWS_JOBS["QUEUES"]): the checks, the claim that keeps them (limited_claims.py),
a model of the bookkeeping, and real workers."""

import time
from collections import Counter

import pytest
from django.db import connection
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import django_rws_jobs as rws
from django_rws_jobs.checks import check_settings
from django_rws_jobs.database import clock
from django_rws_jobs.flow.limited_claims import claim_limited
from django_rws_jobs.flow.limits import QueueLimits, configured, parse_rate
from django_rws_jobs.models import Job
from django_rws_jobs.queue.store import Store
from tests.settings import RWS_JOBS as TEST_JOBS
from tests.test_worker import WorkerProcess, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

T = 2_000_000_000  # a fixed "now" for the claims below


def queues_setting(value):
    return override_settings(RWS_JOBS={**TEST_JOBS, "QUEUES": value})


@pytest.mark.parametrize(
    ("value", "check_id", "message"),
    [
        (["mail"], "rws_jobs.E018", "must be a dict of queue name -> limits"),
        ({"a,b": {"concurrency": 1}}, "rws_jobs.E018", "contains a comma"),
        ({"mail": 10}, "rws_jobs.E018", "must be a dict with 'concurrency' and/or 'rate_limit'"),
        ({"mail": {"limit": 10}}, "rws_jobs.E018", "unknown keys 'limit'"),
        ({"mail": {"concurrency": 0}}, "rws_jobs.E019", "is 0; it must be an integer in [1, 100000]"),
        ({"mail": {"concurrency": True}}, "rws_jobs.E019", "is True"),
        ({"mail": {"concurrency": 100_001}}, "rws_jobs.E019", "in [1, 100000]"),
        ({"mail": {"rate_limit": "100/d"}}, "rws_jobs.E020", "it must be N/s, N/m or N/h"),
        ({"mail": {"rate_limit": "0/s"}}, "rws_jobs.E020", "N must be in [1, 1000000]"),
        ({"mail": {"rate_limit": 100}}, "rws_jobs.E020", "must be a str such as '100/m'"),
    ],
)
def test_each_bad_queue_limit_is_an_error_that_names_it(value, check_id, message):
    with queues_setting(value):
        errors = [m for m in check_settings() if m.id.startswith("rws_jobs.E01") or m.id == "rws_jobs.E020"]
    assert [e.id for e in errors] == [check_id]
    assert message in errors[0].msg


def test_good_limits_pass_and_parse():
    with queues_setting({"mail": {"concurrency": 10, "rate_limit": "100/m"}, "free": {}}):
        assert not [
            m for m in check_settings() if m.id in ("rws_jobs.E018", "rws_jobs.E019", "rws_jobs.E020")
        ]
        assert configured() == {"mail": QueueLimits(10, 100, 60)}  # "free" has none
    assert parse_rate("20/s", "x") == (20, 1) and parse_rate("3/h", "x") == (3, 3600)


SHAPE = "it must be N/s, N/m or N/h, such as '100/m'"
RANGE = "N must be in [1, 1000000]"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("\u00b2/m", SHAPE),  # a superscript two: str.isdigit says yes, int() refuses it
        ("\u0665/m", SHAPE),  # an Arabic-Indic five: int() reads it as 5
        ("\uff15/s", SHAPE),  # a fullwidth five
        ("+5/m", SHAPE),
        ("-5/m", SHAPE),
        (" 5 / m", SHAPE),
        ("5 /m", SHAPE),
        ("5/min", SHAPE),
        ("5/M", SHAPE),
        ("5", SHAPE),
        ("/m", SHAPE),
        ("", SHAPE),
        ("5.0/s", SHAPE),
        ("1_000/s", SHAPE),  # int() takes underscores
        ("0/s", RANGE),
        ("000/s", RANGE),
        ("1000001/s", RANGE),
        ("9" * 5000 + "/s", RANGE),  # int() refuses more than 4300 digits
    ],
)
def test_every_bad_rate_gets_the_usual_message(value, message):
    with pytest.raises(ValueError) as raised:
        parse_rate(value, "RWS_JOBS['QUEUES']['q']['rate_limit']")
    text = str(raised.value)
    assert text.startswith("RWS_JOBS['QUEUES']['q']['rate_limit'] is '") and message in text, text


def test_a_rate_may_have_leading_zeros_and_surrounding_spaces():
    assert parse_rate(" 20/s ", "x") == (20, 1)
    assert parse_rate("007/m", "x") == (7, 60)
    assert parse_rate("1000000/h", "x") == (1_000_000, 3600)


def enqueue_due(n, queue="solo", priority=0):
    return [rws.enqueue("test.record", str(i), queue=queue, priority=priority, run_at=None) for i in range(n)]


def test_a_concurrency_limit_holds_across_claims_and_frees_a_slot_per_finished_job():
    store = Store(connection)
    enqueue_due(5)
    limits = QueueLimits(concurrency=2)
    first, left = claim_limited(store, "solo", limits, "w1#1", T, T + 60, 10)
    assert len(first) == 2 and left  # two slots; three due jobs left for the limit
    assert claim_limited(store, "solo", limits, "w2#1", T, T + 60, 10) == ([], True)
    assert store.complete(first[0])
    again, _ = claim_limited(store, "solo", limits, "w2#2", T, T + 60, 10)
    assert len(again) == 1
    assert Job.objects.filter(status="running", queue="solo").count() == 2


def test_a_rate_limit_counts_the_starts_of_the_last_period():
    store = Store(connection)
    enqueue_due(10)
    due = dict(Job.objects.values_list("id", "next_run_at"))
    limits = QueueLimits(rate=3, period=60)
    assert claim_at(store, limits, T + 1) == 3
    assert claim_at(store, limits, T + 59) == 0
    assert claim_at(store, limits, T + 60.5, want=2) == 0  # (an aligned window would begin at T + 60)
    assert claim_at(store, limits, T + 61, want=2) == 2
    assert claim_at(store, limits, T + 62) == 1
    # Jobs held back by the rate were not charged and keep their due time.
    pending = Job.objects.filter(status="pending")
    assert set(pending.values_list("attempts", flat=True)) == {0} and pending.count() == 4
    assert all(due[job_id] == at for job_id, at in pending.values_list("id", "next_run_at"))


def test_a_claim_handed_an_earlier_now_does_not_start_the_count_again():
    """A claim whose ``now`` was read before it waited for the queue's lock, or on a host whose
    clock is behind, comes after a claim with a later one: it must not begin a fresh allowance,
    nor make the next claim begin another."""
    store = Store(connection)
    enqueue_due(20)
    Job.objects.update(next_run_at=0)  # due whatever ``now`` a claim is handed
    limits = QueueLimits(rate=5, period=60)
    now = int(clock.now())
    took = [
        len(claim_limited(store, "solo", limits, f"w#{i}", at, at + 999, 10)[0])
        for i, at in enumerate((now, now - 60, now))
    ]
    assert took == [5, 0, 0]


def test_a_rate_limit_holds_across_a_window_boundary():
    """3/m: three claims in the last second of a minute leave none for the first second of the
    next, as in any interval of a minute."""
    store = Store(connection)
    enqueue_due(10)
    Job.objects.update(next_run_at=0)
    limits = QueueLimits(rate=3, period=60)
    now = int(clock.now())
    last = now - now % 60 + 59  # the last second of this minute
    assert len(claim_limited(store, "solo", limits, "a#1", last, last + 999, 10)[0]) == 3
    assert claim_limited(store, "solo", limits, "a#2", last + 1, last + 999, 10) == ([], True)


def claim_at(store, limits, at, want=10, queue="solo"):
    """The number of jobs a claim at the queue's time ``at`` (unix seconds) takes."""
    now = int(at)
    return len(claim_limited(store, queue, limits, f"w#{at}", now, now + 9999, want, at=at)[0])


def log_of(queue="solo"):
    """The queue's rate log, oldest first: unix microseconds, None for a slot never written."""
    from django_rws_jobs.models import Queue, QueueStart

    row = Queue.objects.get(name=queue)
    times = dict(QueueStart.objects.filter(queue=queue).values_list("slot", "started_us"))
    order = [(row.rate_next + i) % row.rate_slots for i in range(row.rate_slots)]
    return [times.get(slot) for slot in order]


def test_a_rate_limit_frees_a_start_exactly_one_period_after_it():
    """3/s: a start frees its place in the limit one second after it, to the microsecond, and
    not before; starts keep their own times however the claims fall."""
    store = Store(connection)
    enqueue_due(12)
    Job.objects.update(next_run_at=0)
    limits = QueueLimits(rate=3, period=1)
    t = T + 0.25
    assert claim_at(store, limits, t, want=2) == 2
    assert claim_at(store, limits, t + 0.5) == 1
    assert claim_at(store, limits, t + 0.75) == 0
    assert claim_at(store, limits, t + 0.999999) == 0
    assert claim_at(store, limits, t + 1) == 2  # the two at t, exactly one second on
    assert claim_at(store, limits, t + 1.499999) == 0
    assert claim_at(store, limits, t + 1.5) == 1
    assert log_of() == [round((t + 1) * 1e6)] * 2 + [round((t + 1.5) * 1e6)]


def test_a_claim_whose_clock_is_behind_the_log_writes_no_earlier_time():
    """A claim whose clock reads earlier than the log's newest start counts and writes at that
    newest time: the log never goes back, so it never lets a start in early."""
    store = Store(connection)
    enqueue_due(10)
    Job.objects.update(next_run_at=0)
    limits = QueueLimits(rate=2, period=60)
    assert claim_at(store, limits, T + 30, want=1) == 1
    assert claim_at(store, limits, T + 10, want=5) == 1  # a clock 20 s behind: written at T + 30
    assert log_of() == [(T + 30) * 10**6] * 2
    assert claim_at(store, limits, T + 89) == 0
    assert claim_at(store, limits, T + 90) == 2


def test_a_changed_rate_limit_keeps_the_starts_it_counts():
    """The limit raised (the log grows: the new places are free at once, the old starts keep
    theirs), lowered (its most recent starts count), then raised again, the log wrapped round."""
    store = Store(connection)
    enqueue_due(40)
    Job.objects.update(next_run_at=0)

    def per_minute(n):
        return QueueLimits(rate=n, period=60)

    def us(*seconds):
        return [round((T + s) * 1e6) for s in seconds]

    assert [claim_at(store, per_minute(3), T + s, want=1) for s in (0, 1, 2, 3)] == [1, 1, 1, 0]
    assert claim_at(store, per_minute(3), T + 60, want=1) == 1  # the log wraps round
    assert log_of() == us(1, 2, 60)
    assert claim_at(store, per_minute(5), T + 60.5) == 2  # two new places; T+1 not a minute old
    assert log_of() == us(1, 2, 60, 60.5, 60.5)
    assert claim_at(store, per_minute(5), T + 61) == 1  # T+1's place
    assert claim_at(store, per_minute(2), T + 62) == 0  # its last two: T+60.5, T+61
    assert claim_at(store, per_minute(2), T + 121) == 2
    assert log_of() == us(60.5, 60.5, 61, 121, 121)
    assert claim_at(store, per_minute(6), T + 122) == 4  # a new place, then all but T+121's
    assert log_of() == us(121, 121, 122, 122, 122, 122)
    assert claim_at(store, per_minute(6), T + 181) == 2
    assert claim_at(store, per_minute(6), T + 182) == 4
    assert claim_at(store, per_minute(6), T + 182) == 0


def test_a_large_rate_limit_writes_rows_only_for_its_starts():
    """1,000,000/h: no row is written up front; each start writes one."""
    from django_rws_jobs.models import QueueStart

    store = Store(connection)
    enqueue_due(5)
    Job.objects.update(next_run_at=0)
    limits = QueueLimits(rate=1_000_000, period=3600)
    assert claim_at(store, limits, T, want=3) == 3
    assert claim_at(store, limits, T + 1, want=3) == 2
    assert QueueStart.objects.filter(queue="solo").count() == 5


def test_a_claim_that_takes_nothing_writes_nothing():
    """A claim held back by the rate, or with nothing due, changes no row: idle SQLite workers
    watch PRAGMA data_version, which any write changes."""
    from django_rws_jobs.models import Queue, QueueStart

    store = Store(connection)
    enqueue_due(3)
    Job.objects.update(next_run_at=0)
    limits = QueueLimits(rate=2, period=60)
    assert claim_at(store, limits, T) == 2
    before = (list(Queue.objects.values_list()), list(QueueStart.objects.values_list()))
    assert claim_at(store, limits, T + 1) == 0
    assert claim_at(store, limits, T + 61, queue="empty") == 0
    Queue.objects.filter(name="empty").delete()  # (a first claim inserts the queue's row)
    assert (list(Queue.objects.values_list()), list(QueueStart.objects.values_list())) == before


def test_a_limited_claim_takes_the_highest_priority_first_and_leaves_other_queues_alone():
    store = Store(connection)
    enqueue_due(2, priority=0)
    urgent = enqueue_due(1, priority=5)
    enqueue_due(3, queue="other")
    claimed, _ = claim_limited(store, "solo", QueueLimits(concurrency=1), "w#1", T, T + 60, 5)
    assert [j.id for j in claimed] == urgent
    assert Job.objects.filter(queue="other", status="pending").count() == 3


def test_tick_keeps_a_queue_limit_and_runs_the_limited_queue():
    with queues_setting({"solo": {"rate_limit": "1/h"}}):
        enqueue_due(2)
        assert rws.tick() is True
        assert rws.tick() is False  # the hour's one claim is spent
    assert Job.objects.filter(queue="solo").count() == 1


# -- the bookkeeping against a model ----------------------------------------------------------------

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("enqueue"), st.integers(1, 3)),
        st.tuples(st.just("claim"), st.integers(1, 4)),
        st.tuples(st.just("finish"), st.sampled_from(["complete", "retry", "dead", "release"])),
        st.tuples(st.just("crash"), st.just(0)),  # the holder dies; its leases run out and are recovered
    ),
    max_size=30,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, limit=st.integers(1, 3))
def test_the_bookkeeping_matches_a_model_whatever_the_interleaving(ops, limit):
    """Claims, outcomes, a crash and recovery in any order: the running jobs never exceed the
    limit, every claim takes all the slots that are free (none leaked) and no more (none
    doubled), and jobs are only ever claimed while due and pending."""
    Job.objects.all().delete()
    store = Store(connection)
    limits = QueueLimits(concurrency=limit)
    held: list = []  # the model: the jobs the (live) holders hold
    crashed: list = []  # held by a dead holder: running until recovered
    n = 0
    for op, arg in ops:
        if op == "enqueue":
            enqueue_due(arg)
        elif op == "claim":
            n += 1
            running = len(held) + len(crashed)
            pending = Job.objects.filter(queue="solo", status="pending").count()
            got, left = claim_limited(store, "solo", limits, f"w#{n}", T, T + 60, arg)
            assert len(got) == min(arg, limit - running, pending)
            assert left == (pending > len(got))
            held += got
        elif op == "finish" and held:
            job = held.pop(0)
            if arg == "complete":
                assert store.complete(job)
            elif arg == "retry":
                assert store.reschedule(job, 1, "boom", None, T)
            elif arg == "dead":
                assert store.move_to_dead_letters(job, 1, "boom", None, T)
            else:
                assert store.release(job)
        elif op == "crash":
            crashed += held
            held = []
            for job in store.expired(T + 61, 100):  # recovery, after the leases ran out
                assert store.reschedule(
                    job, job.attempts + 1, "lease expired", None, T, expired_before=T + 61
                )
            crashed = []
        assert Job.objects.filter(queue="solo", status="running").count() == len(held) + len(crashed) <= limit


RATE_OPS = st.lists(
    st.tuples(st.integers(-2, 4), st.integers(1, 5), st.integers(1, 3)),  # time step, limit, want
    max_size=20,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=RATE_OPS, period=st.sampled_from([1, 60]))
def test_the_rate_log_matches_a_model_that_keeps_every_start(ops, period):
    """Claims at times that mostly go forward, sometimes back (a clock behind), often land on the
    boundary of a period, with the limit changed between them: each takes exactly what a model
    that remembers every start allows (at most N in any interval of the period), no fewer."""
    from django_rws_jobs.models import Queue, QueueStart

    Job.objects.all().delete()
    Queue.objects.all().delete()
    QueueStart.objects.all().delete()
    store = Store(connection)
    rws.enqueue_many([{"job_type": "test.record", "queue": "solo"} for _ in range(60)])
    Job.objects.update(next_run_at=0)
    starts: list[int] = []  # the model: every start, unix microseconds
    step = 0
    for i, (delta, rate, want) in enumerate(ops):
        step += delta
        at = T + period * step / 4
        t = max([round(at * 1e6), *starts])  # a claim never writes before the newest start
        recent = sum(1 for started in starts if started > t - period * 10**6)
        expected = max(0, min(want, rate - recent))
        got = claim_limited(
            store, "solo", QueueLimits(rate=rate, period=period), f"w#{i}", T, T + 60, want, at=at
        )
        assert len(got[0]) == expected, (i, at, rate, want, starts)
        starts += [t] * expected


# -- real workers ------------------------------------------------------------------------------------


def most_at_once(prefix: str) -> int:
    """The most jobs whose label starts with ``prefix`` that were between their start and end
    traces at one time (an end is written before its job's slot is freed, a start after its claim)."""
    from tests.testapp.models import Run

    events = (
        Run.objects.filter(payload__startswith=prefix).order_by("at", "id").values_list("kind", flat=True)
    )
    now = most = 0
    for kind in events:
        now += 1 if kind == "start" else -1
        most = max(most, now)
    return most


@pytest.mark.slow
def test_a_concurrency_limit_holds_across_worker_processes(tmp_path, started):
    """3 workers x 4 threads; the queue "narrow" at concurrency 2: no more than 2 of its jobs ever
    overlap, the other queue's jobs run meanwhile, each job once."""
    from tests.testapp.models import Run

    jobs = {"POLL_INTERVAL": 0.1, "QUEUES": {"narrow": {"concurrency": 2}}}
    for i in range(16):
        rws.enqueue("test.span", f"narrow-{i} 0.2", queue="narrow")
        rws.enqueue("test.span", f"wide-{i} 0.2")
    for _ in range(3):
        started.append(WorkerProcess(tmp_path, "--workers", "4", "--burst", jobs=jobs))
    for w in started:
        assert w.wait(120) == 0, w.output()
    assert not Job.objects.exists()
    labels = Counter(Run.objects.values_list("kind", "payload"))
    assert set(labels.values()) == {1} and len(labels) == 64  # each job's start and end, once
    assert most_at_once("narrow-") == 2
    assert most_at_once("wide-") >= 3  # the unlimited queue ran beside it, more at once


def most_in_any_interval(starts: list[float], length: float) -> int:
    """The most of ``starts`` (unix seconds) that one half-open interval of ``length`` holds."""
    starts = sorted(starts)
    most = first = 0
    for last, at in enumerate(starts):
        while starts[first] <= at - length:
            first += 1
        most = max(most, last - first + 1)
    return most


@pytest.mark.slow
def test_a_rate_limit_holds_in_every_interval_across_worker_processes(tmp_path, started):
    """Three idle workers x 4 threads; 200 jobs on a queue at 20/s, enqueued half-way through a
    second of the queue's clock (aligned windows let 20 start then and 20 more at the next
    second). The queue's log, left at 200 places by an earlier limit of 200/s, keeps every claim's
    time (the database server's clock, to the microsecond): no interval of 1 s holds more than 20
    of them. Each handler starts after its claim, each job once, and the queue drains at close to
    20 a second.

    The claims are counted, not the handlers' starts: a handler starts after its claim by a delay
    that varies with the executor threads and the machine's load (more than 0.2 s through
    PyMySQL on two busy cores)."""
    from django_rws_jobs.models import Queue, QueueStart
    from tests.testapp.models import Run

    Queue.objects.create(name="paced", rate_slots=200, rate_next=0)
    jobs = {"POLL_INTERVAL": 0.1, "QUEUES": {"paced": {"rate_limit": "20/s"}}}
    for _ in range(3):
        started.append(WorkerProcess(tmp_path, "--workers", "4", "--queues", "paced", jobs=jobs))
    for w in started:
        w.started()
    time.sleep(0.5)  # past their start-up claims: idle, waiting for work
    time.sleep((0.5 - clock.now()) % 1.0)
    rws.enqueue_many([{"job_type": "test.record", "payload": str(i), "queue": "paced"} for i in range(200)])
    wait_for(lambda: Run.objects.count() >= 200, 60, what="200 jobs to run")
    logged = QueueStart.objects.filter(queue="paced").values_list("started_us", flat=True)
    claims = sorted(us / 1e6 for us in logged)
    assert len(claims) == 200
    assert most_in_any_interval(claims, 1.0) == 20, claims
    starts = sorted(at.timestamp() for at in Run.objects.values_list("at", flat=True))
    assert sorted(Run.objects.values_list("payload", flat=True)) == sorted(str(i) for i in range(200))
    # The k-th claim came before the k-th handler's start (one machine's clock; 1 ms for the
    # rounding of the server's and the host's readings).
    pairs = list(zip(claims, starts, strict=True))
    assert all(claim <= start + 0.001 for claim, start in pairs), pairs
    # Nine more rounds of 20 after the first: at least 9 s, a round late by a poll interval or so.
    assert 9 <= claims[-1] - claims[0] < 9 * 1.5, claims[-1] - claims[0]
