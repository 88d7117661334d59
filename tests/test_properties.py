"""Property-based: arbitrary text (NUL and lone surrogates included), huge and negative ints,
nan and inf, and values of the wrong type, given to enqueue, enqueue_many, retry, delete, tick
and the settings checks, on whichever database RWS_TEST_DB names. Each call either raises the
documented TypeError/ValueError or succeeds, and what it stored reads back exactly."""

import datetime as dt
import time

import pytest
from django.test import override_settings
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import django_rws_jobs as rws
from django_rws_jobs.checks import check_settings, require_valid_settings
from django_rws_jobs.conf import DEFAULTS
from django_rws_jobs.models import Job
from django_rws_jobs.queue.registry import registry
from django_rws_jobs.schedules.declared import check_schedules

pytestmark = pytest.mark.django_db(transaction=True)

# The database fixture is set up once per test, not per example: each example cleans up after itself.
fast = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

any_text = st.text(st.characters(exclude_categories=()), max_size=80)  # NUL and surrogates included
edge_text = st.sampled_from(
    [
        "",
        " ",
        "\x00",
        "a\x00",
        "\udcff",
        "\ud800x",
        "a,b",
        " q",
        "q ",
        "\t",
        "x" * 64,
        "x" * 65,
        "u" * 191,
        "u" * 192,
        "🔥",
        "Ünï",
        "'; --",
        "%s",
        "\\",
    ]
)
texts = st.one_of(any_text, edge_text)
ints = st.one_of(
    st.integers(),
    st.sampled_from(
        [0, -1, 2**31 - 1, 2**31, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 10**30, 10**400, -(10**400)]
    ),
)
floats = st.one_of(st.floats(), st.sampled_from([float("nan"), float("inf"), float("-inf"), 1e308, -0.0]))
wrong = st.one_of(
    st.none(),
    st.booleans(),
    st.binary(max_size=4),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.just(object()),
)
anything = st.one_of(texts, ints, floats, wrong, st.timedeltas(), st.datetimes())
timedeltas = st.one_of(st.timedeltas(), st.sampled_from([dt.timedelta.max, dt.timedelta.min]))
datetimes = st.datetimes(timezones=st.none() | st.timezones())
#: Each enqueue option drawn from what is likely to break it, and from the wrong types.
option_values = {
    "queue": st.one_of(texts, wrong),
    "priority": st.one_of(ints, floats, wrong),
    "run_at": st.one_of(datetimes, texts, wrong),
    "run_in": st.one_of(ints, floats, timedeltas, wrong),
    "unique": st.one_of(texts, wrong),
    "max_retries": st.one_of(ints, floats, wrong),
}
OPTIONS = tuple(option_values)


def _options():
    return st.fixed_dictionaries({}, optional=option_values)


def _expected(job_type, payload="", queue=None, priority=None, unique=None, max_retries=None, **_):
    """The row enqueue must have stored for these arguments."""
    spec = registry.get(job_type)
    defaults = spec.options if spec is not None else {}
    return {
        "job_type": job_type,
        "payload": payload,
        "status": "pending",
        "attempts": 0,
        "queue": defaults.get("queue", "default") if queue is None else queue,
        "priority": defaults.get("priority", 0) if priority is None else priority,
        "unique_key": unique,
        "max_retries": defaults.get("max_retries", 3) if max_retries is None else max_retries,
    }


def _stored(job_id, before):
    """The row's values, once its times are checked: created now, due at a unix second."""
    row = (
        Job.objects.filter(id=job_id)
        .values(
            "job_type",
            "payload",
            "status",
            "attempts",
            "queue",
            "priority",
            "unique_key",
            "max_retries",
            "next_run_at",
            "created_at",
        )
        .get()
    )
    assert before <= row.pop("created_at") <= time.time()
    assert 0 <= row.pop("next_run_at") < 2**63
    # rws_worker --queues a,b can select every queue a job was stored in
    assert [q.strip() for q in row["queue"].split(",")] == [row["queue"]]
    return row


def _enqueue_stores_exactly_or_refuses(job_type, payload, options):
    Job.objects.all().delete()  # a unique key from an earlier example would hold the job
    before = int(time.time())
    try:
        job_id = rws.enqueue(job_type, payload, **options)
    except (TypeError, ValueError):
        assert Job.objects.count() == 0
        return
    assert _stored(job_id, before) == _expected(job_type, payload, **options)


@fast
@given(
    job_type=st.one_of(st.text(max_size=20), texts, wrong),
    payload=st.one_of(st.text(), texts, wrong),
    options=_options(),
)
def test_enqueue_stores_exactly_or_raises_type_or_value_error(job_type, payload, options):
    _enqueue_stores_exactly_or_refuses(job_type, payload, options)


@fast
@given(option=st.sampled_from(OPTIONS).flatmap(lambda key: st.tuples(st.just(key), option_values[key])))
@example(option=("run_in", 10**400))  # values that once got past the checks: always tried
@example(option=("run_in", -(10**400)))
@example(option=("run_in", 1e308))
@example(option=("run_in", dt.timedelta.max))
@example(option=("run_at", dt.datetime.max.replace(tzinfo=dt.timezone(-dt.timedelta(hours=23)))))
@example(option=("queue", "a,b"))
@example(option=("queue", "mail "))
@example(option=("queue", "\n"))
@example(option=("priority", 2**63))
@example(option=("max_retries", 2**31))
def test_each_enqueue_option_is_stored_exactly_or_refused(option):
    _enqueue_stores_exactly_or_refuses("test.record", "p", dict([option]))


def _item():
    plain = st.one_of(st.text(max_size=20), texts, wrong)
    pair = st.tuples(plain, st.one_of(texts, wrong))
    keys = st.sampled_from(("job_type", "payload", *OPTIONS, "now", "using"))
    options = st.one_of(_options(), st.dictionaries(keys, anything, max_size=3))
    as_dict = st.builds(lambda t, rest: {"job_type": t, **rest}, plain, options)
    return st.one_of(plain, pair, as_dict, st.lists(plain, max_size=3), ints)


def _arguments(item):
    if isinstance(item, str):
        return {"job_type": item}
    if isinstance(item, (tuple, list)):
        return dict(zip(("job_type", "payload"), item, strict=False))  # a payload is optional
    return item


@fast
@given(items=st.one_of(st.lists(_item(), max_size=6), texts, st.dictionaries(texts, texts, max_size=2)))
@example(items="a.ok")
@example(items=[{"job_type": "a.ok", "now": -5}])
@example(items=[("a.ok", "p", "mailers")])
def test_enqueue_many_stores_all_exactly_or_nothing(items):
    Job.objects.all().delete()
    before = int(time.time())
    try:
        ids = rws.enqueue_many(items)
    except (TypeError, ValueError):
        assert Job.objects.count() == 0
        return
    assert isinstance(items, list)  # not a str's characters, nor a dict's keys
    assert len(ids) == len(items)
    first = {}  # a unique item after one with the same type and key gets that job's id
    for job_id, item in zip(ids, items, strict=True):
        first.setdefault(job_id, _arguments(item))
    assert Job.objects.count() == len(first)
    for job_id, arguments in first.items():
        assert _stored(job_id, before) == _expected(**arguments)


@fast
@given(job_id=st.one_of(texts, ints, wrong))
@example(job_id="\udcff")
@example(job_id="\x00")
@example(job_id="dead-job ")
@example(job_id="DEAD-JOB")
def test_retry_and_delete_answer_false_or_raise_for_any_id(job_id):
    Job.objects.all().delete()
    dead = Job.objects.create(id="dead-job", job_type="x", status="failed", next_run_at=0, created_at=0)
    for call in (rws.retry, rws.delete):
        try:
            answer = call(job_id)
        except TypeError:
            assert not isinstance(job_id, str)
        except ValueError:
            assert isinstance(job_id, str) and not _storable(job_id)
        else:
            assert answer is (job_id == dead.id)
            assert isinstance(job_id, str) and _storable(job_id)


def _storable(text):
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


@fast
@given(
    queues=st.one_of(
        st.none(), texts, wrong, ints, st.lists(st.one_of(texts, ints, wrong), max_size=3), st.tuples(texts)
    )
)
@example(queues="q")
@example(queues=[5])
@example(queues=[])
def test_tick_takes_a_job_of_the_given_queues_or_raises(queues):
    Job.objects.all().delete()
    job_id = rws.enqueue("test.noop", queue="q")
    try:
        ran = rws.tick(queues=queues)
    except (TypeError, ValueError):
        assert Job.objects.filter(id=job_id).exists()
    else:
        assert ran is (queues is None or "q" in queues)
        assert Job.objects.filter(id=job_id).exists() is not ran


@fast
@given(values=st.dictionaries(st.sampled_from(sorted(DEFAULTS)) | texts | ints, anything, max_size=4))
@example(values={"SHUTDOWN_TIMEOUT": float("inf")})
@example(values={"LEASE_SECONDS": 10**20})
@example(values={"POLL_INTERVAL": float("nan")})
def test_the_settings_checks_report_and_never_raise(values):
    """What the checks pass works (tick() claims with the lease); every delay is finite and bounded."""
    Job.objects.all().delete()
    with override_settings(RWS_JOBS=values):
        messages = check_settings()
        if any(m.is_serious() for m in messages):
            with pytest.raises(ValueError):
                require_valid_settings()
            with pytest.raises(ValueError):
                rws.tick()
        else:
            require_valid_settings()
            assert rws.tick() is False
    delays = ("BACKOFF_INITIAL", "BACKOFF_MAX", "POLL_INTERVAL", "SHUTDOWN_TIMEOUT", "LEASE_SECONDS")
    for key, value in values.items():
        if key in delays and not any(f"RWS_JOBS[{key!r}]" in m.msg for m in messages):
            assert isinstance(value, (int, float)) and 0 <= value <= 365 * 86400


crons = st.sampled_from(["0 * * * * *", "*/5 * * * * *", "0 0 0 30 2 *", "@daily", "61 * * * * *"])
schedule = st.fixed_dictionaries(
    {"cron": st.one_of(crons, texts, wrong), "job_type": st.one_of(st.just("test.record"), texts, wrong)},
    optional={
        "payload": anything,
        "queue": anything,
        "priority": anything,
        "max_retries": anything,
        "unique": anything,
        "run_in": anything,
    },
)


@fast
@given(schedules=st.dictionaries(st.one_of(texts, ints), st.one_of(schedule, anything), max_size=3))
def test_the_schedule_checks_report_and_never_raise(schedules):
    with override_settings(RWS_JOBS={"SCHEDULES": schedules}):
        messages = check_schedules()
    assert all(m.id.startswith("rws_jobs.E1") for m in messages)
