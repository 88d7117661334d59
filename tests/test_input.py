"""Bad input to the API, @job, the settings and the commands: a clear TypeError/ValueError (or a
CommandError) naming the value and the limit, nothing written, the same answer on every database."""

import datetime as dt
import io
import math
import re

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

import django_rws_jobs as rws
from django_rws_jobs.models import Job, JobSchedule
from django_rws_jobs.operations import humanize
from django_rws_jobs.queue.registry import Registry, job, registry
from django_rws_jobs.worker import Worker
from tests.conftest import start_worker, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True)


def noop(payload):
    pass


# -- item 10: a str where a list belongs ----------------------------------------------------------


def test_a_queue_list_must_be_a_list_of_names():
    rws.enqueue("test.record", "m", queue="m")  # "mail" as characters would select it
    with pytest.raises(TypeError, match=r"jobs must be a list of jobs, got str 'a.ok'"):
        rws.enqueue_many("a.ok")
    with pytest.raises(TypeError, match=r"jobs must be a list of jobs, got dict"):
        rws.enqueue_many({"job_type": "a.ok"})
    with pytest.raises(TypeError, match=r"jobs must be a list of jobs, got int 5"):
        rws.enqueue_many(5)
    with pytest.raises(
        TypeError,
        match=r"queues must be a list of queue names, got str 'mail'; for one "
        r"queue write \['mail'\]",
    ):
        rws.tick(queues="mail")
    with pytest.raises(TypeError, match=r"queues must be a list of queue names, got bytes b'mail'"):
        rws.tick(queues=b"mail")
    with pytest.raises(TypeError, match=r"queue name must be a str, got int 5"):
        rws.tick(queues=[5])
    with pytest.raises(TypeError, match=r"queue name must be a str, got NoneType"):
        rws.tick(queues=["m", None])
    with pytest.raises(ValueError, match=r"queues is empty; pass None to take jobs from every queue"):
        rws.tick(queues=[])
    assert list(Job.objects.values_list("queue", flat=True)) == ["m"]
    assert rws.tick(queues=("m",)) is True


def test_worker_takes_the_same_queue_lists():
    with pytest.raises(TypeError, match=r"queues must be a list of queue names, got str 'mail'"):
        Worker(queues="mail")
    with pytest.raises(TypeError, match=r"queue name must be a str, got int 5"):
        Worker(queues=[5])
    with pytest.raises(ValueError, match=r"queues is empty"):
        Worker(queues=[])
    assert Worker(queues=("a", "b")).queues == ["a", "b"]
    assert Worker().queues is None


# -- item 11: enqueue_many's dict items take enqueue's options only -------------------------------


def test_enqueue_many_items_take_only_enqueues_options():
    keys = (
        "job_type, payload, queue, priority, run_at, run_in, unique, max_retries, timeout, concurrency_key, "
    )
    keys += "after, on_dependency_failure, metadata, on_conflict, max_delay, unique_for"
    with pytest.raises(TypeError, match=rf"^job #0: unknown key 'now'; the known ones are {keys}$"):
        rws.enqueue_many([{"job_type": "a.ok", "now": -5}])
    with pytest.raises(TypeError, match=r"^job #1: unknown keys 'using', 5; the known ones are"):
        rws.enqueue_many([{"job_type": "a"}, {"job_type": "a", "using": "default", 5: 1}])
    with pytest.raises(TypeError, match=r"^job #0: a dict needs a 'job_type'$"):
        rws.enqueue_many([{"payload": "p"}])
    with pytest.raises(TypeError, match=r"^job #0: a job must be a job_type, a \(job_type, payload\) pair"):
        rws.enqueue_many([("a", "p", "mailers")])
    with pytest.raises(TypeError, match=r"^job #0: a job must be"):
        rws.enqueue_many([()])
    assert Job.objects.count() == 0
    [job_id] = rws.enqueue_many(
        [
            {
                "job_type": "a",
                "payload": "p",
                "queue": "q",
                "priority": 2,
                "unique": "u",
                "max_retries": 1,
                "run_in": 5,
            }
        ]
    )
    job = Job.objects.get(id=job_id)
    assert (job.payload, job.queue, job.priority, job.unique_key, job.max_retries) == ("p", "q", 2, "u", 1)
    assert job.created_at > 0


# -- item 12: @job's options are checked when it is registered ------------------------------------


def test_job_options_are_checked_at_registration():
    r = Registry()
    with pytest.raises(
        TypeError,
        match=r"job_type 'x': unknown options 'max_retires', 'queu', 'prioirty'; "
        r"the known ones are queue, priority, max_retries, timeout, concurrency_limit, schedule",
    ):
        r.register("x", noop, max_retires=10, queu="mailers", prioirty=5)
    with pytest.raises(TypeError, match=r"job_type 'tests.input.typo': unknown option 'queu'"):
        job("tests.input.typo", queu="mailers")(noop)
    assert "tests.input.typo" not in registry
    bad = [
        ({"queue": 5}, TypeError, "job_type 'x': queue name must be a str, got int 5"),
        ({"queue": ""}, ValueError, "queue name must not be empty"),
        ({"queue": "q" * 65}, ValueError, "is 65 characters; the limit is 64"),
        ({"queue": "a,b"}, ValueError, "queue name 'a,b' contains a comma"),
        ({"priority": 2**63}, ValueError, "priority 9223372036854775808 is out of range"),
        ({"priority": "5"}, TypeError, "priority must be an int, got str '5'"),
        (
            {"max_retries": -1},
            ValueError,
            "max_retries -1 is out of range; it must be between 0 and 2147483647",
        ),
        ({"max_retries": 1.0}, TypeError, "max_retries must be an int, got float 1.0"),
    ]
    for options, exc, message in bad:
        with pytest.raises(exc) as info:
            r.register("x", noop, **options)
        assert message in str(info.value)
    with pytest.raises(ValueError, match=r"job_type '\\x00' contains a NUL"):
        r.register("\x00", noop)
    assert r.job_types() == []
    r.register("x", noop, queue="q", priority=-3, max_retries=0, schedule="0 0 3 * * *")
    assert r.get("x").options == {"queue": "q", "priority": -3, "max_retries": 0}


# -- item 13: queue names that --queues can select, and no blank --queues -------------------------


@pytest.mark.parametrize(
    "name, message",
    [
        ("a,b", "queue name 'a,b' contains a comma; rws_worker --queues could not select it"),
        (" a", "queue name ' a' starts or ends with whitespace"),
        ("a ", "queue name 'a ' starts or ends with whitespace"),
        ("a\u00a0", "starts or ends with whitespace"),
        ("a\tb", r"queue name 'a\tb' contains a control character"),
        ("a\x7fb", "contains a control character"),
        ("a\x00b", "contains a NUL character"),
    ],
)
def test_queue_names_that_queues_cannot_select_are_refused(name, message):
    with pytest.raises(ValueError) as info:
        rws.enqueue("x", queue=name)
    assert message in str(info.value)
    with pytest.raises(ValueError, match=r"^job #1: queue name"):
        rws.enqueue_many(["x", {"job_type": "x", "queue": name}])
    with pytest.raises(ValueError, match="queue name"):
        rws.tick(queues=[name])
    assert Job.objects.count() == 0


def test_queue_names_with_inner_spaces_and_any_script_are_fine():
    names = ["a b", "mailers", "Ünïcødé 🔥", "q'\\%"]
    for name in names:
        rws.enqueue("test.record", name, queue=name)
    assert sorted(Job.objects.values_list("queue", flat=True)) == sorted(names)
    for name in names:
        assert rws.tick(queues=[name]) is True
    assert Job.objects.count() == 0


@pytest.mark.parametrize("queues", ["", ",,,", " ", " , "])
def test_rws_worker_refuses_a_blank_queue_list(queues):
    with pytest.raises(
        CommandError,
        match=r"--queues '.*' names no queue; leave --queues out to run every "
        r"queue",
    ):
        call_command("rws_worker", "--queues", queues, "--burst")


@pytest.mark.parametrize(
    "queues, message",
    [
        ("a,b\tc", r"queue name 'b\\tc' contains a control character"),
        ("a," + "q" * 65, "is 65 characters; the limit is 64"),
    ],
)
def test_rws_worker_refuses_queue_names_enqueue_refuses(queues, message):
    with pytest.raises(CommandError, match=message):
        call_command("rws_worker", "--queues", queues, "--burst")


def test_a_blank_queue_list_exits_non_zero_and_runs_nothing():
    """An unset $QUEUES in a deploy script (``--queues "$QUEUES"``) must not run every queue."""
    rws.enqueue("test.record", "untouched")
    proc = start_worker("--queues", "", "--burst")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, out
    assert "CommandError: --queues '' names no queue" in out
    assert Job.objects.count() == 1


# -- item 14: numbers in settings and flags are finite and bounded, one rule for both -------------


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-1", "3600.5", "1e400"])
def test_rws_worker_refuses_a_poll_interval_out_of_bounds(value):
    with pytest.raises(
        CommandError,
        match=r"^--poll-interval is .*; it must be a number of seconds in "
        r"\(0, 3600\]$",
    ):
        call_command("rws_worker", f"--poll-interval={value}", "--burst")


def test_worker_refuses_bad_arguments_and_settings():
    must = r"it must be a number of seconds in \(0, 3600\]"
    with pytest.raises(ValueError, match=rf"^poll_interval is nan; {must}$"):
        Worker(poll_interval=math.nan)
    with pytest.raises(ValueError, match=rf"^poll_interval is inf; {must}$"):
        Worker(poll_interval=math.inf)
    with pytest.raises(TypeError, match=rf"^poll_interval is '1'; {must}$"):
        Worker(poll_interval="1")
    with pytest.raises(ValueError, match=r"threads 0 is out of range"):
        Worker(threads=0)
    with pytest.raises(TypeError, match=r"threads must be an int, got str '2'"):
        Worker(threads="2")
    with pytest.raises(ValueError, match=r"max_jobs 0 is out of range"):
        Worker(max_jobs=0)
    assert Worker(poll_interval=3600, threads=2, max_jobs=1).poll_interval == 3600.0
    with override_settings(RWS_JOBS={"SHUTDOWN_TIMEOUT": math.inf, "LEASE_SECONDS": 10**20}):
        with pytest.raises(ValueError) as info:
            Worker()
    assert str(info.value) == (
        "RWS_JOBS['LEASE_SECONDS'] is 100000000000000000000; it must be an integer number of seconds in "
        "[2, 604800] (rws_jobs.E008); RWS_JOBS['SHUTDOWN_TIMEOUT'] is inf; it must be a number of seconds "
        "in [0, 86400] (rws_jobs.E009)"
    )


@override_settings(RWS_JOBS={"LEASE_SECONDS": 10**20})
def test_tick_refuses_a_lease_out_of_bounds_before_claiming():
    rws.enqueue("test.record", "p")
    with pytest.raises(
        ValueError,
        match=r"RWS_JOBS\['LEASE_SECONDS'\] is 100000000000000000000; it must be "
        r"an integer number of seconds in \[2, 604800\] \(rws_jobs.E008\)",
    ):
        rws.tick()
    assert Job.objects.get().status == "pending"


def test_an_infinite_shutdown_timeout_stops_the_worker_at_start():
    """It used to pass the check and crash the stop with an OverflowError, the job neither
    finished nor handed back."""
    proc = start_worker("--burst", env=subprocess_env(RWS_TEST_JOBS='{"SHUTDOWN_TIMEOUT": Infinity}'))
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, out
    assert (
        "(rws_jobs.E009) RWS_JOBS['SHUTDOWN_TIMEOUT'] is inf; it must be a number of seconds in [0, 86400]"
    ) in out


# -- item 15: huge delays and malformed ids -------------------------------------------------------


def test_huge_delays_are_a_value_error_naming_the_limit():
    huge = r"\(a 1329-bit integer\)"
    with pytest.raises(ValueError, match=rf"^run_in {huge} is too far ahead; the limit is \d+ seconds$"):
        rws.enqueue("x", run_in=10**400)
    with pytest.raises(ValueError, match=r"^run_in 1e\+308 is too far ahead; the limit is \d+ seconds$"):
        rws.enqueue("x", run_in=float("1e308"))
    with pytest.raises(ValueError, match=rf"^run_in -{huge} must be a finite, non-negative delay"):
        rws.enqueue("x", run_in=-(10**400))
    with pytest.raises(ValueError, match=r"^run_in 9223372036854775807 is too far ahead"):
        rws.enqueue("x", run_in=2**63 - 1)
    with pytest.raises(ValueError, match=r"^job #0: run_in \(a 1329-bit integer\) is too far ahead"):
        rws.enqueue_many([{"job_type": "x", "run_in": 10**400}])
    assert Job.objects.count() == 0


def test_the_farthest_datetimes_are_stored():
    utc, west = dt.timezone.utc, dt.timezone(-dt.timedelta(hours=23, minutes=59))
    far = [
        dt.datetime.max.replace(tzinfo=utc),
        dt.datetime.max.replace(tzinfo=west),
        dt.datetime.min.replace(tzinfo=utc),
        dt.datetime.min.replace(tzinfo=west),
    ]
    ids = [rws.enqueue("x", run_at=at) for at in far]
    stored = dict(Job.objects.values_list("id", "next_run_at"))
    assert [stored[i] for i in ids] == [253402300800, 253402387140, 0, 0]
    assert Job.objects.get(id=rws.enqueue("x", run_in=dt.timedelta.max)).next_run_at > 8 * 10**13


def test_retry_and_delete_give_the_same_answer_on_every_database():
    failed = Job.objects.create(id="dead", job_type="x", status="failed", next_run_at=0, created_at=0)
    for call in (rws.retry, rws.delete):
        for bad in ("\udcff", "dead\udcff", "\x00", "dead\x00"):
            with pytest.raises(ValueError, match=r"^job id '.*' (contains a NUL|is not valid Unicode)"):
                call(bad)
        for bad in (None, 5, b"dead", ["dead"]):
            with pytest.raises(TypeError, match=r"^job id must be a str, got "):
                call(bad)
        for missing in ("", "x" * 65, "x" * 10_000, "DEAD", "dead ", "🔥"):
            assert call(missing) is False, (call, missing)
    with pytest.raises(ValueError, match=r"^now -1 is out of range"):
        rws.retry("dead", now=-1)
    assert rws.retry("dead") is True and rws.delete("dead") is True
    assert not Job.objects.filter(pk=failed.pk).exists()


# -- item 18: rws_schedules shows any stored due time ---------------------------------------------


def test_rws_schedules_shows_any_stored_due_time():
    values = {"far": 2**62, "last": 2**63 - 1, "first": -(2**63), "before-1970": -1}
    for name, t in values.items():
        JobSchedule.objects.create(name=name, next_run_at=t, cron="0 * * * * *")
    declared = {"far": {"cron": "0 * * * * *", "job_type": "test.record"}}
    out = io.StringIO()
    with override_settings(RWS_JOBS={"SCHEDULES": declared}):
        call_command("rws_schedules", stdout=out)
    text = out.getvalue()
    assert re.search(
        r"^  far +0 \* \* \* \* \* +test.record +4611686018427387904 \(unix seconds\) "
        r"\(in \d+ y\)$",
        text,
        re.MULTILINE,
    ), text
    assert humanize.absolute(2**62) == "4611686018427387904 (unix seconds)"
    assert re.search(
        r"^  last +0 \* \* \* \* \* +9223372036854775807 \(unix seconds\) \(in \d+ y\)$", text, re.MULTILINE
    ), text
    assert re.search(
        r"^  first +0 \* \* \* \* \* +-9223372036854775808 \(unix seconds\) \(\d+ y ago\)$",
        text,
        re.MULTILINE,
    ), text
    assert re.search(
        r"^  before-1970 +0 \* \* \* \* \* +1969-12-31 23:59:59 UTC \(\d+ y ago\)$", text, re.MULTILINE
    ), text


# -- issue 50, item 1: a NUL in a JSON value --------------------------------------------------------

NUL_MESSAGE = r"holds the text 'a\\x00b', which contains a NUL character; PostgreSQL cannot store it$"


def test_a_nul_in_any_json_value_is_refused_on_every_database():
    """json.dumps writes a NUL as \\u0000, which PostgreSQL's jsonb refuses at the INSERT (the
    finish of a batch whose callback carried one failed at every sweep): every JSON value the queue
    stores refuses it up front, a ValueError on every database, and the caller's transaction goes
    on."""
    from django.db import transaction

    from django_rws_jobs.running.context import output_text
    from django_rws_jobs.tasks.compat import InvalidTask
    from tests.testapp.tasks import tagged

    for metadata in ({"s": "a\x00b"}, {"a\x00b": 1}, {"deep": [{"x": ["ok", "a\x00b"]}]}):
        with transaction.atomic():
            with pytest.raises(ValueError, match=r"^metadata " + NUL_MESSAGE):
                rws.enqueue("test.record", "x", metadata=metadata)
            with pytest.raises(ValueError, match=r"^job #1: metadata " + NUL_MESSAGE):
                rws.enqueue_many(["test.record", {"job_type": "test.record", "metadata": metadata}])
            with pytest.raises(ValueError, match=r"^metadata " + NUL_MESSAGE):
                rws.call("test.record", "cb", metadata=metadata)
            with pytest.raises(ValueError, match=r"^metadata " + NUL_MESSAGE):
                rws.batch(metadata=metadata)
            with pytest.raises(InvalidTask, match=r"^metadata " + NUL_MESSAGE):
                tagged.using(metadata=metadata)
            kept = rws.enqueue("test.record", "after", metadata={"fine": True})
    with pytest.raises(ValueError, match=r"^record\(\)'s value " + NUL_MESSAGE):
        output_text(["a\x00b"])
    assert Job.objects.filter(payload="after", metadata__fine=True).count() == 3
    assert Job.objects.count() == 3 and Job.objects.filter(id=kept).exists()
    # The text "\u0000" (a backslash, then "u0000") holds no NUL: it is kept as it is.
    backslash = rws.enqueue("test.record", "y", metadata={"s": "\\u0000", "t": "\\\\u0000"})
    assert Job.objects.get(id=backslash).metadata == {"s": "\\u0000", "t": "\\\\u0000"}
    assert output_text("\\u0000") == '"\\\\u0000"'
