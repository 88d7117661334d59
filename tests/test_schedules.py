"""Cron schedules: declaration and checks, tick_schedules driven by ``now``, and real processes."""

import calendar
import datetime as dt
import io
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
from django.conf import settings
from django.core import checks
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.test import override_settings

from django_rws_jobs import job, tick_schedules
from django_rws_jobs.models import Job, JobSchedule
from django_rws_jobs.queue.registry import registry
from django_rws_jobs.schedules.declared import Schedule, declared
from django_rws_jobs.schedules.ticks import undeclared_rows
from django_rws_jobs.worker import Scheduler
from tests.conftest import ROOT, run_python, start_worker, subprocess_env

pytestmark = pytest.mark.django_db

MINUTELY = {"cron": "0 * * * * *", "job_type": "test.record", "payload": "m"}


def ts(text: str) -> int:
    return calendar.timegm(dt.datetime.fromisoformat(text).timetuple())


def with_schedules(**schedules):
    return override_settings(RWS_JOBS={**settings.RWS_JOBS, "SCHEDULES": schedules})


def row(name):
    return JobSchedule.objects.filter(name=name).values_list("next_run_at", "cron").first()


def jobs(payload=None):
    qs = Job.objects.order_by("created_at", "id")
    if payload is not None:
        qs = qs.filter(payload=payload)
    return list(qs.values_list("job_type", "payload", "queue", "priority", "max_retries"))


@pytest.fixture
def temp_jobs():
    """Register handlers (with schedules) for one test; unregister them after it."""
    names = []

    def register(job_type, **options):
        job(job_type, **options)(lambda payload: None)
        names.append(job_type)

    yield register
    for name in names:
        registry.unregister(name)


# -- tick_schedules, driven by ``now`` -------------------------------------------------------------


def test_first_sight_stores_the_next_due_time_and_enqueues_nothing():
    with with_schedules(m=MINUTELY):
        assert tick_schedules(now=ts("2024-01-01 00:00:30")) == 0
        assert row("m") == (ts("2024-01-01 00:01:00"), "0 * * * * *")
        # Strictly after now: a schedule first seen on one of its due times does not run then.
        JobSchedule.objects.all().delete()
        assert tick_schedules(now=ts("2024-01-01 00:01:00")) == 0
        assert row("m") == (ts("2024-01-01 00:02:00"), "0 * * * * *")
    assert jobs() == []


def test_a_schedules_jobs_carry_its_metadata():
    schedule = {**MINUTELY, "metadata": {"source": "cron", "n": 1}}
    JobSchedule.objects.create(name="m", next_run_at=ts("2024-01-01 00:01:00"), cron="0 * * * * *")
    with with_schedules(m=schedule):
        assert tick_schedules(now=ts("2024-01-01 00:01:00")) == 1
    assert Job.objects.get().metadata == {"source": "cron", "n": 1}


def test_a_schedules_bad_metadata_is_a_check_error():
    assert _check(m={**MINUTELY, "metadata": ["not", "a", "dict"]}) == [
        ("rws_jobs.E104", "schedule 'm': metadata must be a dict, got list ['not', 'a', 'dict']")
    ]


def test_due_enqueues_once_with_its_payload_and_options():
    schedule = {**MINUTELY, "queue": "reports", "priority": 7, "max_retries": 1}
    JobSchedule.objects.create(name="m", next_run_at=ts("2024-01-01 00:01:00"), cron="0 * * * * *")
    with with_schedules(m=schedule):
        assert tick_schedules(now=ts("2024-01-01 00:01:00")) == 1
        assert row("m") == (ts("2024-01-01 00:02:00"), "0 * * * * *")
        assert jobs() == [("test.record", "m", "reports", 7, 1)]
        # The same due time again, and any time before the next one: nothing.
        assert tick_schedules(now=ts("2024-01-01 00:01:00")) == 0
        assert tick_schedules(now=ts("2024-01-01 00:01:59")) == 0
        assert tick_schedules(now=ts("2024-01-01 00:02:00")) == 1
    assert len(jobs()) == 2


def test_a_unique_schedule_skips_runs_while_its_last_job_is_pending():
    JobSchedule.objects.create(name="m", next_run_at=ts("2024-01-01 00:01:00"), cron="0 * * * * *")
    with with_schedules(m={**MINUTELY, "unique": "minutely"}):
        tick_schedules(now=ts("2024-01-01 00:01:00"))
        tick_schedules(now=ts("2024-01-01 00:02:00"))
    assert row("m")[0] == ts("2024-01-01 00:03:00")
    assert jobs() == [("test.record", "m", "default", 0, 3)]


def test_not_due_yet():
    JobSchedule.objects.create(name="m", next_run_at=ts("2024-01-01 00:01:00"), cron="0 * * * * *")
    with with_schedules(m=MINUTELY):
        assert tick_schedules(now=ts("2024-01-01 00:00:59")) == 0
    assert row("m") == (ts("2024-01-01 00:01:00"), "0 * * * * *")
    assert jobs() == []


def test_due_times_missed_during_downtime_collapse_into_one_run():
    JobSchedule.objects.create(name="m", next_run_at=ts("2024-01-01 00:01:00"), cron="0 * * * * *")
    with with_schedules(m=MINUTELY):
        assert tick_schedules(now=ts("2024-01-01 03:17:42")) == 1
        assert tick_schedules(now=ts("2024-01-01 03:17:43")) == 0
    assert row("m") == (ts("2024-01-01 03:18:00"), "0 * * * * *")
    assert len(jobs()) == 1


def test_a_changed_expression_takes_effect_at_once():
    # Stored for "0 0 3 * * *": due at 03:00. Now declared every minute: due at 00:01, not 03:00.
    JobSchedule.objects.create(name="m", next_run_at=ts("2024-01-01 03:00:00"), cron="0 0 3 * * *")
    with with_schedules(m=MINUTELY):
        assert tick_schedules(now=ts("2024-01-01 00:00:30")) == 0
        assert row("m") == (ts("2024-01-01 00:01:00"), "0 * * * * *")
        assert tick_schedules(now=ts("2024-01-01 00:01:00")) == 1
    # And back to 03:00: the stored 00:02 is not run.
    with with_schedules(m={**MINUTELY, "cron": "0 0 3 * * *"}):
        assert tick_schedules(now=ts("2024-01-01 00:01:30")) == 0
        assert row("m") == (ts("2024-01-01 03:00:00"), "0 0 3 * * *")
        assert tick_schedules(now=ts("2024-01-01 00:02:00")) == 0
    assert len(jobs()) == 1


def test_a_row_written_by_the_seed_has_no_expression_and_is_treated_as_changed():
    # rust-web-server inserts (name, next_run_at) only.
    with connection.cursor() as c:
        c.execute(
            "INSERT INTO rws_job_schedules (name, next_run_at) VALUES (%s, %s)",
            ["m", ts("2024-01-01 03:00:00")],
        )
    with with_schedules(m=MINUTELY):
        assert tick_schedules(now=ts("2024-01-01 00:00:30")) == 0
        assert row("m") == (ts("2024-01-01 00:01:00"), "0 * * * * *")
    assert jobs() == []


def test_a_due_time_that_has_passed_runs_once_even_if_the_expression_changed():
    # A seed row whose due time has come (say the Rust replicas stopped): it runs once, like any
    # missed due time, and the row now carries the expression.
    with connection.cursor() as c:
        c.execute(
            "INSERT INTO rws_job_schedules (name, next_run_at) VALUES (%s, %s)",
            ["m", ts("2024-01-01 00:00:10")],
        )
    with with_schedules(m=MINUTELY):
        assert tick_schedules(now=ts("2024-01-01 00:00:30")) == 1
        assert tick_schedules(now=ts("2024-01-01 00:00:31")) == 0
    assert row("m") == (ts("2024-01-01 00:01:00"), "0 * * * * *")
    assert len(jobs()) == 1


@pytest.mark.django_db(transaction=True)
def test_one_failing_schedule_does_not_stop_the_others_and_loses_nothing(caplog):
    due = ts("2024-01-01 00:01:00")
    for name in ("a-bad", "b-good"):
        JobSchedule.objects.create(name=name, next_run_at=due, cron="0 * * * * *")
    bad = Schedule("a-bad", "0 * * * * *", "test.record", None)  # enqueue refuses a None payload
    good = Schedule("b-good", "0 * * * * *", "test.record", "good")
    with caplog.at_level(logging.ERROR, logger="django_rws_jobs"):
        assert tick_schedules(now=due, schedules=[bad, good]) == 1
    assert jobs() == [("test.record", "good", "default", 0, 3)]
    assert row("b-good")[0] == ts("2024-01-01 00:02:00")
    # The claim and the enqueue are one transaction: the failed enqueue left the due time unclaimed.
    assert row("a-bad")[0] == due
    assert "schedule 'a-bad' failed" in caplog.text and "payload must be a str" in caplog.text


def test_a_due_time_that_is_not_an_integer_is_replaced_not_skipped_for_ever():
    """Another program's row may hold a REAL or TEXT due time on SQLite. The compare-and-set on
    the due time read it rounded to an integer and never matched, so the schedule never fired; a
    TEXT one failed every second. Such a row gets the next due time after now."""
    if connection.vendor != "sqlite":
        pytest.skip("only SQLite keeps a value that is not an integer in a BIGINT column")
    names = {"real-past": "1704067000.5", "real-huge": "1e300", "text": "'abc'"}
    with connection.cursor() as c:
        for name, value in names.items():
            c.execute(f"INSERT INTO rws_job_schedules (name, next_run_at) VALUES ('{name}', {value})")
    schedules = [Schedule(name, "0 * * * * *", "test.record", name) for name in names]
    assert tick_schedules(now=ts("2024-01-01 00:00:30"), schedules=schedules) == 0
    assert {name: row(name) for name in names} == dict.fromkeys(
        names, (ts("2024-01-01 00:01:00"), "0 * * * * *")
    )
    assert tick_schedules(now=ts("2024-01-01 00:01:00"), schedules=schedules) == 3
    assert sorted(payload for _, payload, *_ in jobs()) == sorted(names)


def test_inside_a_callers_transaction_a_database_error_does_not_spoil_the_others():
    due = ts("2024-01-01 00:01:00")
    JobSchedule.objects.create(name="b-good", next_run_at=due, cron="0 * * * * *")
    # A name longer than the column: a database error on PostgreSQL and MySQL, which would abort
    # the whole transaction without a savepoint.
    if connection.vendor == "sqlite":
        pytest.skip("SQLite stores a name of any length")
    bad = Schedule("a" * 300, "0 * * * * *", "test.record", "bad")
    good = Schedule("b-good", "0 * * * * *", "test.record", "good")
    with transaction.atomic():
        assert tick_schedules(now=due, schedules=[bad, good]) == 1
    assert jobs("good") == [("test.record", "good", "default", 0, 3)]


def test_rows_no_longer_declared_are_left_alone_and_reported():
    JobSchedule.objects.create(name="gone", next_run_at=ts("2024-01-01 00:00:10"), cron="0 * * * * *")
    with with_schedules(m=MINUTELY):
        assert tick_schedules(now=ts("2024-01-01 00:00:30")) == 0
        assert row("gone") == (ts("2024-01-01 00:00:10"), "0 * * * * *")
        assert [r.name for r in undeclared_rows()] == ["gone"]
    assert jobs() == []


# -- declaring schedules ---------------------------------------------------------------------------


def test_settings_and_job_decorator_schedules_make_one_list(temp_jobs):
    temp_jobs("tests.sched.plain", schedule="0 0 3 * * *")
    temp_jobs(
        "tests.sched.many",
        queue="low",
        schedule=[
            {"name": "many-a", "cron": "0 0 4 * * *", "payload": "a", "priority": 2},
            {"name": "many-b", "cron": "@hourly"},
        ],
    )
    with with_schedules(m=MINUTELY):
        schedules, errors = declared()
    assert errors == []
    assert [(s.name, s.cron, s.job_type, s.payload, s.options, s.source) for s in schedules] == [
        ("m", "0 * * * * *", "test.record", "m", {}, "RWS_JOBS['SCHEDULES']"),
        ("tests.sched.plain", "0 0 3 * * *", "tests.sched.plain", "", {}, "@job('tests.sched.plain')"),
        ("many-a", "0 0 4 * * *", "tests.sched.many", "a", {"priority": 2}, "@job('tests.sched.many')"),
        ("many-b", "@hourly", "tests.sched.many", "", {}, "@job('tests.sched.many')"),
    ]
    # The job_type's own defaults (queue="low") apply to the jobs its schedule enqueues.
    JobSchedule.objects.create(name="many-a", next_run_at=ts("2024-01-01 04:00:00"), cron="0 0 4 * * *")
    with with_schedules():
        assert tick_schedules(now=ts("2024-01-01 04:00:00")) == 1
    assert jobs() == [("tests.sched.many", "a", "low", 2, 3)]


def _check(**schedules):
    with with_schedules(**schedules):
        return [(m.id, m.msg) for m in checks.run_checks(tags=["rws_jobs"]) if m.id.startswith("rws_jobs.E1")]


@pytest.mark.parametrize(
    "entry, check_id, message",
    [
        (
            {"cron": "0 0 25 * * *", "job_type": "test.record"},
            "rws_jobs.E101",
            "schedule 'x': cron expression '0 0 25 * * *': hour 25 is out of range 0-23",
        ),
        (
            {"cron": "* * * *", "job_type": "test.record"},
            "rws_jobs.E101",
            "schedule 'x': cron expression '* * * *' has 4 fields; it needs 6 "
            "(second minute hour day-of-month month day-of-week), or 5 without the second",
        ),
        (
            {"cron": 5, "job_type": "test.record"},
            "rws_jobs.E101",
            "schedule 'x': cron expression 5 must be a string, not int",
        ),
        (
            {"cron": ["* * * * * *"], "job_type": "test.record"},
            "rws_jobs.E101",
            "schedule 'x': cron expression ['* * * * * *'] must be a string, not list",
        ),
        (
            {"cron": "0 0 0 30 2 *", "job_type": "test.record"},
            "rws_jobs.E102",
            "schedule 'x': cron expression '0 0 0 30 2 *' never fires: "
            "day-of-month '30' never occurs in month '2'",
        ),
        (
            {"cron": "0 0 3 * * *", "job_type": "reports.nightly"},
            "rws_jobs.E103",
            "schedule 'x': job_type 'reports.nightly' has no registered handler; "
            "register one with @job('reports.nightly') in a jobs.py module",
        ),
        (
            "0 0 3 * * *",
            "rws_jobs.E104",
            "schedule 'x': must be a dict with 'cron' and 'job_type' (optional: payload, queue, priority, "
            "max_retries, unique, concurrency_key, metadata) or with 'cron' and 'task' "
            "(optional: args, kwargs), "
            "got str '0 0 3 * * *'",
        ),
        ({"cron": "0 0 3 * * *"}, "rws_jobs.E104", "schedule 'x': needs 'job_type'"),
        (
            {"cron": "0 0 3 * * *", "job_type": "test.record", "run_in": 5},
            "rws_jobs.E104",
            "schedule 'x': unknown key(s) 'run_in'; the keys are cron, job_type, payload, queue, priority, "
            "max_retries, unique, concurrency_key, metadata (a task's: cron, task, args, kwargs)",
        ),
        (
            {"cron": "0 0 3 * * *", "job_type": "test.record", "payload": b"x"},
            "rws_jobs.E104",
            "schedule 'x': payload must be a str, got bytes b'x'",
        ),
        (
            {"cron": "0 0 3 * * *", "job_type": "test.record", "priority": "high"},
            "rws_jobs.E104",
            "schedule 'x': priority must be an int, got str 'high'",
        ),
        (
            {"cron": "0 0 3 * * *", "job_type": "test.record", "max_retries": -1},
            "rws_jobs.E104",
            "schedule 'x': max_retries -1 is out of range; it must be between 0 and 2147483647",
        ),
        (
            {"cron": "0 0 3 * * *", "job_type": "test.record", "queue": "q" * 65},
            "rws_jobs.E104",
            f"schedule 'x': queue name {'q' * 40 + '...'!r} is 65 characters; the limit is 64",
        ),
        (
            {"cron": "0 0 3 * * *", "job_type": 7},
            "rws_jobs.E104",
            "schedule 'x': job_type must be a str, got int 7",
        ),
    ],
)
def test_each_bad_schedule_is_a_check_error_naming_it(entry, check_id, message):
    assert _check(ok=MINUTELY, x=entry) == [(check_id, message)]


def test_every_problem_of_one_schedule_is_reported():
    assert _check(x={"cron": "0 0 24 * * *", "job_type": "nope", "payload": None}) == [
        ("rws_jobs.E101", "schedule 'x': cron expression '0 0 24 * * *': hour 24 is out of range 0-23"),
        ("rws_jobs.E104", "schedule 'x': payload must be a str, got NoneType None"),
    ]


def test_a_bad_name_is_a_check_error():
    assert _check(**{"n" * 192: MINUTELY}) == [
        (
            "rws_jobs.E104",
            f"schedule {'n' * 192!r}: the name must be a string of 1 to 191 characters "
            "(declared in RWS_JOBS['SCHEDULES'])",
        ),
    ]


@pytest.mark.django_db(transaction=True)
def test_a_name_no_database_stores_is_a_check_error_and_the_others_run():
    """A NUL (PostgreSQL refuses it) or a lone surrogate (no driver can send it) in a name would
    spoil the one read of every schedule's row: the check names it, and the others still run."""
    bad = {"nul\x00": MINUTELY, "surrogate\udcff": MINUTELY}
    assert _check(**bad) == [
        (
            "rws_jobs.E104",
            "schedule 'nul\\x00': the name 'nul\\x00' contains a NUL character, which PostgreSQL "
            "cannot store (declared in RWS_JOBS['SCHEDULES'])",
        ),
        (
            "rws_jobs.E104",
            "schedule 'surrogate\\udcff': the name 'surrogate\\udcff' is not valid Unicode text: "
            "surrogates not allowed (declared in RWS_JOBS['SCHEDULES'])",
        ),
    ]
    with with_schedules(good=MINUTELY, **bad):
        assert tick_schedules(now=ts("2024-01-01 00:00:30")) == 0
        assert tick_schedules(now=ts("2024-01-01 00:01:00")) == 1
    assert list(JobSchedule.objects.values_list("name", flat=True)) == ["good"]
    # Past the check (a Schedule made by hand), the failed read is logged, not raised.
    made = Schedule("surrogate\udcff", "0 * * * * *", "test.record", "m")
    assert tick_schedules(now=ts("2024-01-01 00:02:00"), schedules=[made]) == 0


def test_a_nul_in_a_schedules_metadata_is_a_check_error_and_the_others_run(temp_jobs, caplog):
    """PostgreSQL's jsonb refuses a NUL, which json.dumps writes as \\u0000: a schedule declared
    with one (in the settings, or by a handler registered at run time) is a check error and does
    not run; one made past the checks fails alone, logged, while the others fire."""
    bad = {**MINUTELY, "metadata": {"s": "a\x00b"}}
    decorated = {"name": "decorated", "cron": "0 * * * * *", "metadata": {"k": ["a\x00b"]}}
    temp_jobs("tests.sched.nul", schedule=decorated)
    message = "holds the text 'a\\x00b', which contains a NUL character; PostgreSQL cannot store it"
    assert _check(nul=bad) == [
        ("rws_jobs.E104", f"schedule 'nul': metadata {message}"),
        ("rws_jobs.E104", f"schedule 'decorated': metadata {message}"),
    ]
    with with_schedules(good=MINUTELY, nul=bad):
        assert tick_schedules(now=ts("2024-01-01 00:00:30")) == 0
        assert tick_schedules(now=ts("2024-01-01 00:01:00")) == 1
    assert sorted(JobSchedule.objects.values_list("name", flat=True)) == ["good"]
    # Past the checks (a Schedule made by hand): its enqueue fails, logged; the others fire.
    made = Schedule("made", "0 * * * * *", "test.record", "made", {"metadata": {"s": "a\x00b"}})
    good = Schedule("good", "0 * * * * *", "test.record", "m")
    JobSchedule.objects.create(name="made", next_run_at=ts("2024-01-01 00:02:00"), cron="0 * * * * *")
    with caplog.at_level(logging.ERROR, logger="django_rws_jobs"):
        assert tick_schedules(now=ts("2024-01-01 00:02:00"), schedules=[made, good]) == 1
    assert "schedule 'made' failed" in caplog.text and message in caplog.text
    assert jobs() == [("test.record", "m", "default", 0, 3)] * 2
    assert row("made")[0] == ts("2024-01-01 00:02:00")  # unclaimed: tried again at the next tick


def test_duplicate_names_are_check_errors_and_neither_runs(temp_jobs):
    temp_jobs("tests.sched.dup1", schedule={"name": "m", "cron": "0 0 3 * * *"})
    assert _check(m=MINUTELY) == [
        (
            "rws_jobs.E105",
            "schedule 'm': is declared 2 times (RWS_JOBS['SCHEDULES'], "
            "@job('tests.sched.dup1')); schedule names must be unique",
        ),
    ]
    temp_jobs("tests.sched.dup2", schedule=["0 0 4 * * *", {"name": "m", "cron": "@daily"}])
    assert _check() == [
        (
            "rws_jobs.E105",
            "schedule 'm': is declared 2 times (@job('tests.sched.dup1'), "
            "@job('tests.sched.dup2')); schedule names must be unique",
        ),
    ]
    with with_schedules():
        assert [s.name for s in declared()[0]] == ["tests.sched.dup2"]
    temp_jobs("tests.sched.dup3", schedule=["0 0 4 * * *", "0 0 5 * * *"])
    assert (
        "rws_jobs.E105",
        "schedule 'tests.sched.dup3': is declared 2 times (@job('tests.sched.dup3'), "
        "@job('tests.sched.dup3')); schedule names must be unique",
    ) in _check()


def test_registering_a_handler_again_does_not_duplicate_its_schedule(temp_jobs):
    temp_jobs("tests.sched.again", schedule="0 0 3 * * *")
    handler = registry.get("tests.sched.again").func
    registry.register("tests.sched.again", handler, schedule="0 0 4 * * *")  # a re-imported module
    registry.register("tests.sched.again", handler)  # register() without a schedule keeps it
    assert _check() == []
    with with_schedules():
        assert [(s.name, s.cron) for s in declared()[0]] == [("tests.sched.again", "0 0 4 * * *")]


def test_a_bad_schedule_on_the_decorator_is_a_check_error_too(temp_jobs):
    temp_jobs("tests.sched.bad", schedule="0 0 0 31 4 *")
    temp_jobs("tests.sched.shape", schedule=42)
    assert _check() == [
        (
            "rws_jobs.E102",
            "schedule 'tests.sched.bad': cron expression '0 0 0 31 4 *' never fires: "
            "day-of-month '31' never occurs in month '4'",
        ),
        (
            "rws_jobs.E104",
            "schedule 'tests.sched.shape': must be a dict with 'cron' and 'job_type' "
            "(optional: payload, queue, priority, max_retries, unique, concurrency_key, metadata) "
            "or with 'cron' and "
            "'task' (optional: args, kwargs), got int 42",
        ),
    ]


def test_rws_worker_refuses_to_start_with_the_check_messages():
    from tests.settings_bad_schedules import SCHEDULES

    expected = _check(**SCHEDULES)
    assert sorted(i for i, _ in expected) == [f"rws_jobs.E10{n}" for n in (1, 2, 3, 4)]
    env = subprocess_env(DJANGO_SETTINGS_MODULE="tests.settings_bad_schedules")
    proc = subprocess.run(
        [sys.executable, "-m", "django", "rws_worker", "--burst"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1
    assert "SystemCheckError" in proc.stderr
    for check_id, message in expected:
        assert f"({check_id}) {message}" in proc.stderr


def test_rws_schedules_lists_declared_schedules_and_stray_rows():
    now = int(time.time())
    nightly = {"cron": "0 0 3 * * *", "job_type": "test.record"}
    JobSchedule.objects.create(name="m", next_run_at=now + 3600, cron="0 * * * * *")
    JobSchedule.objects.create(name="old", next_run_at=1704067200, cron=None)
    out = io.StringIO()
    with with_schedules(m=MINUTELY, nightly=nightly):
        call_command("rws_schedules", stdout=out)
    text = out.getvalue()
    at = dt.datetime.fromtimestamp(now + 3600, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    assert re.search(rf"^  m +0 \* \* \* \* \* +test.record +{at} \(in 1 h\)$", text, re.MULTILINE), text
    assert re.search(
        r"^  nightly +0 0 3 \* \* \* +test.record +\d{4}-\d\d-\d\d 03:00:00 UTC \(in .*\), "
        r"once a worker has seen it$",
        text,
        re.MULTILINE,
    ), text
    assert "Rows no schedule here declares" in text
    assert re.search(
        r"^  old +\(none stored: a rust-web-server row\) +2024-01-01 00:00:00 UTC "
        r"\(\d+ y ago\)$",
        text,
        re.MULTILINE,
    ), text

    err = io.StringIO()
    with with_schedules(m={**MINUTELY, "cron": "61 * * * * *"}):
        with pytest.raises(CommandError, match="1 schedule error"):
            call_command("rws_schedules", stdout=io.StringIO(), stderr=err)
    assert (
        "schedule 'm': cron expression '61 * * * * *': second 61 is out of range 0-59 (rws_jobs.E101)"
        in err.getvalue()
    )


def test_the_scheduler_thread_stays_alive_without_schedules_until_stopped():
    stop = threading.Event()
    with with_schedules():
        t = threading.Thread(target=Scheduler(stop, "default").loop, daemon=True)
        t.start()
        t.join(0.3)
        assert t.is_alive()  # returning early would make the worker restart it in a busy loop
        stop.set()
        t.join(5)
    assert not t.is_alive()


def _kill_other_connections():
    with connection.cursor() as c:
        if connection.vendor == "postgresql":
            c.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        else:
            c.execute(
                "SELECT ID FROM information_schema.PROCESSLIST "
                "WHERE DB = DATABASE() AND ID <> CONNECTION_ID()"
            )
            for (pid,) in c.fetchall():
                c.execute(f"KILL CONNECTION {int(pid)}")


def _wait_for(predicate, timeout):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_scheduler_thread_reconnects_after_losing_its_connection(caplog):
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has no server connection to lose")
    if os.environ.get("RWS_TEST_POOLER"):
        pytest.skip("a pooler keeps its client's connection when the server's is killed")
    every_second = {"cron": "*/1 * * * * *", "job_type": "test.record", "payload": "tick"}
    JobSchedule.objects.create(name="s", next_run_at=int(time.time()) + 1, cron="*/1 * * * * *")
    stop = threading.Event()
    with with_schedules(s=every_second), caplog.at_level(logging.WARNING, logger="django_rws_jobs"):
        t = threading.Thread(target=Scheduler(stop, "default").loop, daemon=True)
        t.start()
        try:
            _wait_for(lambda: len(jobs("tick")) >= 1, 5)
            _kill_other_connections()
            killed_at, before = time.time(), len(jobs("tick"))
            _wait_for(lambda: row("s")[0] > killed_at + 2, 10)  # ticking again after the kill
        finally:
            stop.set()
            t.join(5)
    assert not t.is_alive()
    assert "schedules: database error" in caplog.text  # the kill did reach the scheduler's connection
    assert len(jobs("tick")) > before


# -- real processes --------------------------------------------------------------------------------

RACE_CODE = """
import os, time
from pathlib import Path
from django_rws_jobs.models import JobSchedule
from django_rws_jobs.schedules.declared import valid_schedules
from django_rws_jobs.schedules.ticks import tick_schedules
race = [s for s in valid_schedules() if s.name == "race"]
assert race, "no 'race' schedule in settings"
JobSchedule.objects.filter(name="race").exists()  # connect before the start line
here = Path({dir!r})
(here / f"ready-{{os.getpid()}}").touch()
while not (here / "go").exists():
    time.sleep(0.002)
start = float((here / "go").read_text())
while time.time() < start:
    pass
print("enqueued", tick_schedules(now={now}, schedules=race))
"""


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_six_processes_ticking_the_same_due_time_enqueue_one_job(tmp_path):
    due = ts("2024-01-01 01:00:00")  # a due time of the hourly "race" schedule
    JobSchedule.objects.create(name="race", next_run_at=due, cron="0 0 * * * *")
    env = subprocess_env(DJANGO_SETTINGS_MODULE="tests.settings_schedules")
    procs = [run_python(RACE_CODE.format(dir=str(tmp_path), now=due + 30), env=env) for _ in range(6)]
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("ready-*"))) < 6:
        assert time.monotonic() < deadline, "the children did not get ready"
        exited = [p.communicate()[0] for p in procs if p.poll() is not None]
        assert not exited, exited
        time.sleep(0.01)
    (tmp_path / "go.tmp").write_text(str(time.time() + 0.2))
    os.replace(tmp_path / "go.tmp", tmp_path / "go")
    outputs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * 6, outputs
    counts = [int(re.search(r"^enqueued (\d+)$", out, re.MULTILINE).group(1)) for out in outputs]
    assert sorted(counts) == [0, 0, 0, 0, 0, 1], outputs
    assert jobs("race") == [("test.record", "race", "default", 0, 3)]
    assert row("race") == (ts("2024-01-01 02:00:00"), "0 0 * * * *")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_two_workers_enqueue_each_due_second_once(runs):
    env = subprocess_env(DJANGO_SETTINGS_MODULE="tests.settings_schedules", RWS_LOG_LEVEL="INFO")
    first = int(time.time()) + 2
    JobSchedule.objects.create(name="every-second", next_run_at=first, cron="*/1 * * * * *")
    workers = [start_worker("--workers", "2", "-v", "2", env=env) for _ in range(2)]  # enqueues: DEBUG
    try:
        time.sleep(max(first + 5.5 - time.time(), 0))  # real processes for five due seconds
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
    outputs = [w.communicate(timeout=60)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], outputs

    pattern = re.compile(r"schedule 'every-second' due at (\S+) enqueued")
    claimed = [ts(t) for out in outputs for t in pattern.findall(out)]
    assert len(claimed) == len(set(claimed)), f"a due second was enqueued twice: {sorted(claimed)}"
    enqueued = len(jobs("tick")) + len([r for r in runs() if r[1] == "tick"])
    assert enqueued == len(claimed)
    last = row("every-second")[0]
    # Each claim moves the due time on by at least a second, so more jobs than seconds means a
    # second was enqueued twice; fewer than seconds - 1 means the scheduler fell behind.
    assert last - first - 1 <= enqueued <= last - first, (first, last, sorted(claimed))
    assert 5 <= last - first <= 7
    assert all(first <= t < last for t in claimed)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_burst_worker_ticks_schedules_only_when_asked(runs):
    env = subprocess_env(DJANGO_SETTINGS_MODULE="tests.settings_schedules")
    overdue = int(time.time()) - 10
    JobSchedule.objects.create(name="every-second", next_run_at=overdue, cron="*/1 * * * * *")

    proc = start_worker("--burst", env=env)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, out
    assert row("every-second")[0] == overdue
    assert row("race") is None  # not even seen
    assert jobs() == [] and runs() == []

    proc = start_worker("--burst", "--schedules", env=env)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, out
    assert row("every-second")[0] > overdue
    assert row("race") is not None
    assert jobs("tick") == [] and len(runs()) >= 1  # what the tick enqueued ran in the same burst


def test_the_scheduler_counts_its_enqueues_once_a_minute(caplog):
    """Each cron enqueue is a DEBUG line, in ISO 8601 UTC; the scheduler logs one INFO line a
    minute counting them, none for a minute with none (worker/scheduler.py Scheduler.count)."""
    due = ts("2024-01-01 00:01:00")
    JobSchedule.objects.create(name="m", next_run_at=due, cron=MINUTELY["cron"])
    schedule = Schedule("m", MINUTELY["cron"], "test.record", "m")
    with caplog.at_level(logging.DEBUG, logger="django_rws_jobs"):
        assert tick_schedules(now=due, schedules=[schedule]) == 1
    [enqueued] = [r for r in caplog.records if "enqueued job" in r.getMessage()]
    assert enqueued.levelno == logging.DEBUG
    assert enqueued.getMessage().startswith("schedule 'm' due at 2024-01-01T00:01:00Z enqueued job ")
    assert enqueued.getMessage().endswith("; next due at 2024-01-01T00:02:00Z")

    caplog.clear()
    scheduler = Scheduler(threading.Event(), "default")
    start = scheduler.next_count - 60
    with caplog.at_level(logging.INFO, logger="django_rws_jobs"):
        for second in range(1, 121):  # a job every 5 seconds for two minutes, then one idle minute
            scheduler.count(1 if second % 5 == 0 and second <= 120 else 0, start + second)
        for second in range(121, 241):
            scheduler.count(0, start + second)
    counts = [r.getMessage() for r in caplog.records]
    assert counts == ["schedules enqueued 12 job(s) in the last minute"] * 2
    assert all(r.levelno == logging.INFO for r in caplog.records)
