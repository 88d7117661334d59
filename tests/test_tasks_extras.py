"""django.tasks beyond the backend: pruning results, cron schedules and enqueue_many naming
tasks, the admin's task fields and results list."""

import calendar
import datetime as dt
import json
import time

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import transaction
from django.test import override_settings
from django.urls import reverse

tasks_api = pytest.importorskip("django_rws_jobs.tasks.compat")

import django_rws_jobs as rws  # noqa: E402
from django_rws_jobs.models import Job, JobSchedule, TaskResultRecord  # noqa: E402
from django_rws_jobs.schedules.declared import check_schedules  # noqa: E402
from django_rws_jobs.schedules.ticks import tick_schedules  # noqa: E402
from django_rws_jobs.tasks.prune import prune, prune_expired  # noqa: E402
from tests.testapp import tasks  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)
Status = tasks_api.TaskResultStatus


def result_row(result_id, finished_at, queue="default"):
    return TaskResultRecord.objects.create(
        id=result_id,
        task_path="tests.testapp.tasks.record",
        queue=queue,
        priority=0,
        payload=json.dumps({"args": ["x"], "kwargs": {}, "backend": "default", "enqueued_at": 1.0}),
        return_value='"ok"',
        history=json.dumps({"errors": [], "worker_ids": ["w"]}),
        finished_at=finished_at,
    )


def test_prune_deletes_only_what_is_older_and_in_the_queues():
    now = 1_000_000
    result_row("old", now - 100)
    result_row("old-emails", now - 100, queue="emails")
    result_row("new", now - 10)
    assert prune("default", 50, now=now, dry_run=True) == 2
    assert TaskResultRecord.objects.count() == 3
    assert prune("default", 50, queues=["emails"], now=now) == 1
    assert prune("default", 50, now=now) == 1
    assert list(TaskResultRecord.objects.values_list("id", flat=True)) == ["new"]


def test_prune_works_in_batches(monkeypatch):
    from django_rws_jobs.tasks import prune as module

    monkeypatch.setattr(module, "BATCH", 3)
    for i in range(8):
        result_row(f"r{i}", 10)
    assert prune("default", 0, now=100) == 8 and not TaskResultRecord.objects.exists()


def test_the_workers_pruning_follows_results_retention():
    now = time.time()
    result_row("week-old", int(now) - 8 * 86400)
    result_row("recent", int(now) - 60)
    assert prune_expired("default", now) == 1
    assert list(TaskResultRecord.objects.values_list("id", flat=True)) == ["recent"]
    keep = {"default": {**settings.TASKS["default"], "OPTIONS": {"RESULTS_RETENTION": None}}}
    result_row("ancient", 0)
    with override_settings(TASKS=keep):
        assert prune_expired("default", now) == 0
    assert TaskResultRecord.objects.filter(id="ancient").exists()


def test_the_prune_command(capsys):
    now = int(time.time())
    result_row("a", now - 3 * 86400)
    result_row("b", now - 3 * 86400, queue="emails")
    call_command("rws_prune_task_results", "--older-than", "2d", "--dry-run")
    assert "would delete 2 task result(s)" in capsys.readouterr().out
    call_command("rws_prune_task_results", "--older-than", "2d", "--queues", "emails")
    assert "deleted 1 task result(s)" in capsys.readouterr().out
    call_command("rws_prune_task_results")  # RESULTS_RETENTION: 7 days
    assert "deleted 0 task result(s)" in capsys.readouterr().out
    with pytest.raises(CommandError, match="--older-than"):
        call_command("rws_prune_task_results", "--older-than", "soon")


def test_pruning_keeps_what_any_backend_keeps(capsys):
    """A result records its queue, not its backend: it goes once it is older than the longest
    retention of the backends that take its queue, and never while one of them keeps results."""
    day = 86400
    now = int(time.time())
    base = settings.TASKS["default"]
    for name, queue, age in [
        ("default-2d", "default", 2 * day),
        ("archive-2d", "archive", 2 * day),
        ("other-2d", "other", 2 * day),
        ("other-40d", "other", 40 * day),
    ]:
        result_row(name, now - age, queue=queue)
    two = {
        "default": {**base, "OPTIONS": {"RESULTS_RETENTION": 3600}},
        "archive": {**base, "QUEUES": ["archive"], "OPTIONS": {"RESULTS_RETENTION": None}},
    }
    with override_settings(TASKS=two):
        call_command("rws_prune_task_results", "--queues", "archive", "--dry-run")
        assert "would delete 0 task result(s)" in capsys.readouterr().out
        assert prune_expired("default", now) == 1  # default-2d: only "default" takes its queue
    anywhere = {**base, "QUEUES": [], "OPTIONS": {"RESULTS_RETENTION": 30 * day}}
    result_row("default-2d", now - 2 * day)
    with override_settings(TASKS={**two, "anywhere": anywhere}):
        assert prune_expired("default", now) == 1  # other-40d; "anywhere" keeps default-2d 30 days
    left = set(TaskResultRecord.objects.values_list("id", flat=True))
    assert left == {"default-2d", "archive-2d", "other-2d"}


def test_the_prune_command_refuses_an_empty_queue_list_and_an_endless_age():
    result_row("a", 0)
    with pytest.raises(CommandError, match="must not be empty"):
        call_command("rws_prune_task_results", "--queues", "")
    with pytest.raises(CommandError, match=r"too long: the limit is 31536000000 s"):
        call_command("rws_prune_task_results", "--older-than", "9" * 400)
    assert TaskResultRecord.objects.filter(id="a").exists()


def ts(text):
    return calendar.timegm(dt.datetime.fromisoformat(text).timetuple())


def test_a_schedule_may_name_a_task():
    schedule = {"cron": "0 * * * * *", "task": "tests.testapp.tasks.email", "args": ["ops@x"], "kwargs": {}}
    JobSchedule.objects.create(name="t", next_run_at=ts("2024-01-01 00:01:00"), cron="0 * * * * *")
    with override_settings(RWS_JOBS={**settings.RWS_JOBS, "SCHEDULES": {"t": schedule}}):
        assert check_schedules() == []
        assert tick_schedules(now=ts("2024-01-01 00:01:00")) == 1
    (job,) = Job.objects.all()
    result = tasks_api.task_backends["default"].get_result(job.id)
    assert (result.task.func, result.args, result.task.queue_name) == (tasks.email.func, ["ops@x"], "emails")
    assert rws.tick() is True
    assert tasks_api.task_backends["default"].get_result(job.id).return_value == "sent to ops@x"


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"cron": "* * * * * *", "task": "tests.testapp.tasks.nope"}, "cannot be imported"),
        ({"cron": "* * * * * *", "task": "tests.testapp.jobs.record"}, "not a task"),
        ({"cron": "* * * * * *", "task": "tests.testapp.tasks.email", "args": [{1, 2}]}, "JSON"),
        ({"cron": "* * * * * *", "task": "tests.testapp.tasks.email", "queue": "q"}, "a task schedule takes"),
    ],
)
def test_a_bad_task_schedule_is_a_check_error(entry, message):
    with override_settings(RWS_JOBS={**settings.RWS_JOBS, "SCHEDULES": {"bad": entry}}):
        errors = check_schedules()
    assert [e.id for e in errors] == ["rws_jobs.E104"] and message in errors[0].msg


def test_enqueue_many_takes_tasks_beside_jobs():
    ids = rws.enqueue_many(
        [
            "test.record",
            {"task": tasks.record, "args": ["bulk"]},
            {"task": tasks.email, "args": ["a@x"], "kwargs": {"subject": "s"}},
        ]
    )
    backend = tasks_api.task_backends["default"]
    assert backend.get_result(ids[1]).args == ["bulk"]
    assert backend.get_result(ids[2]).kwargs == {"subject": "s"}
    with pytest.raises(TypeError, match="RwsJobsBackend"):
        rws.enqueue_many([{"task": "tests.testapp.tasks.record"}])
    with pytest.raises(tasks_api.InvalidTask):
        rws.enqueue_many([{"task": tasks.record, "args": [object()]}])
    assert Job.objects.count() == 3


def test_the_admin_shows_task_rows_as_tasks_and_lists_results(admin_client):
    failing = tasks.fail.enqueue("admin-boom")
    assert rws.tick() is True
    page = admin_client.get(reverse("admin:django_rws_jobs_job_change", args=[failing.id])).content.decode()
    assert "tests.testapp.tasks.fail" in page and "admin-boom" in page
    assert "builtins.ValueError" in page
    done = tasks.record.enqueue("shown")
    assert rws.tick() is True
    listing = admin_client.get(reverse("admin:django_rws_jobs_taskresultrecord_changelist"))
    assert listing.status_code == 200 and done.id in listing.content.decode()
    detail = admin_client.get(reverse("admin:django_rws_jobs_taskresultrecord_change", args=[done.id]))
    assert detail.status_code == 200 and "shown" in detail.content.decode()
    assert admin_client.get(reverse("admin:django_rws_jobs_taskresultrecord_add")).status_code == 403


def test_a_tasks_concurrency_key_is_its_function_of_the_arguments():
    """The key function sees the arguments as the worker will; the limit is the task's."""
    with transaction.atomic():  # (enqueue promotes its job at commit)
        result = tasks.sync_account.enqueue(42, full=True)
        job = Job.objects.get(id=result.id)
        assert (job.status, job.concurrency_key, job.concurrency_limit) == ("waiting", "account:42", 2)
        assert result.status == Status.READY  # waiting for its key reads as READY, as pending does
    fixed = tasks.sync_account.using().with_options(concurrency_key="nightly", concurrency_limit=1)
    job = Job.objects.get(id=fixed.enqueue(7).id)
    assert (job.concurrency_key, job.concurrency_limit) == ("nightly", 1)
    while rws.tick():
        pass
    assert not Job.objects.exists()
    assert tasks.sync_account.get_result(result.id).return_value == 42


@pytest.mark.parametrize(
    "options, message",
    [
        ({"concurrency_key": ""}, "concurrency_key must not be empty"),
        (
            {"concurrency_key": 5},
            "concurrency_key must be a str or a function of the task's arguments, got int 5",
        ),
        ({"concurrency_limit": 0}, "concurrency_limit 0 is out of range; it must be between 1 and 100000"),
        ({"concurrency_key": lambda account, **kw: account}, "must return a str, returned int 42"),
    ],
)
def test_a_bad_concurrency_option_of_a_task_is_refused_naming_it(options, message):
    with pytest.raises(tasks_api.InvalidTask, match=message):  # when the task is made, or enqueued
        tasks.sync_account.using().with_options(**options).enqueue(42)
    assert not Job.objects.exists()
