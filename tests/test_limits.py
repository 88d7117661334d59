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
from django_rws_jobs import clock
from django_rws_jobs.checks import check_settings
from django_rws_jobs.limited_claims import claim_limited
from django_rws_jobs.limits import QueueLimits, configured, parse_rate
from django_rws_jobs.models import Job
from django_rws_jobs.store import Store
from tests.settings import RWS_JOBS as TEST_JOBS
from tests.test_worker import WorkerProcess

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


def test_a_rate_limit_counts_the_claims_of_each_window():
    store = Store(connection)
    enqueue_due(10)
    limits = QueueLimits(rate=3, period=60)
    window = T - T % 60
    assert len(claim_limited(store, "solo", limits, "a#1", window + 1, window + 999, 10)[0]) == 3
    assert claim_limited(store, "solo", limits, "a#2", window + 59, window + 999, 10) == ([], True)
    assert len(claim_limited(store, "solo", limits, "a#3", window + 60, window + 999, 2)[0]) == 2
    assert len(claim_limited(store, "solo", limits, "a#4", window + 61, window + 999, 10)[0]) == 1
    # Jobs held back by the rate were not charged and keep their due time.
    assert set(Job.objects.filter(status="pending").values_list("attempts", flat=True)) == {0}


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


@pytest.mark.slow
def test_a_rate_limit_holds_across_worker_processes(tmp_path, started):
    """200 due jobs on a queue at 20/s, two workers: no unix second of the queue's clock has more
    than 20 claims (the failed rows keep their started_at), and all are done in about 10 s."""
    jobs = {"POLL_INTERVAL": 0.1, "QUEUES": {"paced": {"rate_limit": "20/s"}}}
    rws.enqueue_many(
        [{"job_type": "test.fail", "payload": str(i), "queue": "paced", "max_retries": 0} for i in range(200)]
    )
    begun = time.monotonic()
    for _ in range(2):
        started.append(WorkerProcess(tmp_path, "--workers", "4", "--burst", jobs=jobs))
    for w in started:
        assert w.wait(60) == 0, w.output()
    took = time.monotonic() - begun
    per_second = Counter(Job.objects.filter(status="failed").values_list("started_at", flat=True))
    assert sum(per_second.values()) == 200
    assert max(per_second.values()) <= 20, per_second
    assert took < 10 + 5, took
