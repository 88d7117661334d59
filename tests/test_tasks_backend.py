"""The django.tasks backend in one process: validation, enqueue, get_result, and task rows run
by tick() (the worker's code on the caller's thread)."""

import datetime as dt
import json
import math
import subprocess
import sys
import time

import pytest
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

tasks_api = pytest.importorskip("django_rws_jobs.tasks.compat")

import django_rws_jobs as rws  # noqa: E402
from django_rws_jobs.models import Job, TaskResultRecord  # noqa: E402
from django_rws_jobs.queue.registry import TASK_PREFIX  # noqa: E402
from django_rws_jobs.tasks import RwsJobsBackend  # noqa: E402
from tests.conftest import ROOT, subprocess_env  # noqa: E402
from tests.testapp import tasks  # noqa: E402

InvalidTask = tasks_api.InvalidTask
TaskResultDoesNotExist = tasks_api.TaskResultDoesNotExist
Status = tasks_api.TaskResultStatus

pytestmark = pytest.mark.django_db(transaction=True)


def backend() -> RwsJobsBackend:
    return tasks_api.task_backends["default"]


def make_due() -> None:
    Job.objects.filter(status="pending").update(next_run_at=0)


def test_the_backend_declares_what_it_supports():
    b = backend()
    assert isinstance(b, RwsJobsBackend)
    assert (b.supports_defer, b.supports_async_task, b.supports_get_result, b.supports_priority) == (
        True,
        True,
        True,
        True,
    )


def test_importing_the_backend_touches_neither_models_nor_the_database():
    code = (
        "import sys, django.conf; django.conf.settings.configure(); "
        "import django_rws_jobs.tasks.backend as b; print(b.RwsJobsBackend.__name__); "
        "print('django_rws_jobs.models' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=subprocess_env(), capture_output=True, text=True
    )
    assert out.stdout.split() == ["RwsJobsBackend", "False"], out.stderr


def test_enqueue_returns_a_ready_result_equal_to_get_result():
    result = tasks.email.enqueue("ann@example.com", subject="hi")
    assert result.status == Status.READY
    assert (result.args, result.kwargs, result.backend) == (["ann@example.com"], {"subject": "hi"}, "default")
    assert result.enqueued_at is not None and result.started_at is None and result.errors == []
    again = tasks.email.get_result(result.id)
    assert again == result
    job = Job.objects.get(id=result.id)
    assert job.job_type == TASK_PREFIX + "tests.testapp.tasks.email"
    assert (job.queue, job.priority, job.max_retries) == ("emails", 7, 3)
    assert json.loads(job.payload)["args"] == ["ann@example.com"]


def test_enqueue_joins_the_callers_transaction():
    with pytest.raises(RuntimeError), transaction.atomic():
        result = tasks.record.enqueue("rolled back")
        raise RuntimeError
    with pytest.raises(TaskResultDoesNotExist):
        backend().get_result(result.id)
    with transaction.atomic():
        kept = tasks.record.enqueue("kept")
    assert backend().get_result(kept.id).status == Status.READY


def test_run_after_and_priority_map_to_the_row():
    later = timezone.now() + dt.timedelta(hours=1)
    result = tasks.record.using(run_after=later, priority=-5).enqueue("later")
    job = Job.objects.get(id=result.id)
    assert job.next_run_at == math.ceil(later.timestamp()) and job.priority == -5
    assert backend().get_result(result.id).task.run_after == later
    assert rws.tick() is False  # not due yet


def test_task_enqueued_is_sent():
    seen = []

    def receiver(sender, task_result, **kwargs):
        seen.append((sender, task_result.id))

    tasks_api.task_enqueued.connect(receiver)
    try:
        result = tasks.record.enqueue("x")
    finally:
        tasks_api.task_enqueued.disconnect(receiver)
    assert seen == [(RwsJobsBackend, result.id)]


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: tasks.record.using(priority=101), "priority must be a whole number between -100 and 100."),
        (lambda: tasks.record.using(queue_name="nope"), "Queue 'nope' is not valid for backend."),
        (
            lambda: tasks.record.using(run_after=dt.datetime(2030, 1, 1)),
            "run_after must be an aware datetime.",
        ),
        (
            lambda: tasks.record.using(run_after=dt.timedelta(seconds=5)),
            "run_after must be an aware datetime",
        ),
    ],
)
def test_invalid_tasks_raise_invalid_task_with_djangos_messages(make, message):
    with pytest.raises(InvalidTask) as info:
        make().enqueue("x")
    assert str(info.value).startswith(message)
    assert Job.objects.count() == 0


@pytest.mark.parametrize(
    "args, kwargs",
    [
        ([{1, 2}], {}),
        ([object()], {}),
        ([math.nan], {}),
        ([], {"x": math.inf}),
        ([{1: "int key"}], {}),
    ],
)
def test_arguments_json_cannot_carry_are_invalid(args, kwargs):
    with pytest.raises(InvalidTask):
        tasks.record.enqueue(*args, **kwargs)
    assert Job.objects.count() == 0


def test_tuples_and_bytes_arrive_as_json_makes_them():
    result = tasks.record.enqueue((1, 2), b"bytes")
    assert result.args == [[1, 2], "bytes"]
    assert backend().get_result(result.id).args == [[1, 2], "bytes"]


def test_a_task_defined_in_main_or_a_function_is_refused():
    from tests.testapp.tasks import task

    def local():
        pass

    with pytest.raises(InvalidTask, match="module level"):
        task(local)
    local.__module__ = "__main__"
    local.__qualname__ = "local"
    with pytest.raises(InvalidTask, match="__main__"):
        task(local)


@pytest.mark.parametrize("bad", [None, 42, "", "x" * 65, "nul\x00", "no-such-id"])
def test_unknown_or_malformed_ids_do_not_exist(bad):
    with pytest.raises(TaskResultDoesNotExist):
        backend().get_result(bad)


def test_a_plain_jobs_id_is_not_a_task_result():
    job_id = rws.enqueue("test.record", "x")
    with pytest.raises(TaskResultDoesNotExist):
        backend().get_result(job_id)


def test_the_task_prefix_is_reserved():
    with pytest.raises(ValueError, match="reserved"):
        rws.register(TASK_PREFIX + "mine", lambda payload: None)


def test_a_task_runs_and_its_result_is_kept(runs):
    result = tasks.record.enqueue("hello")
    assert rws.tick() is True
    assert runs() == [("task", "hello")]
    done = tasks.record.get_result(result.id)
    assert done.status == Status.SUCCESSFUL
    assert done.return_value["payload"] == "hello"
    assert done.started_at and done.finished_at and done.last_attempted_at
    assert done.enqueued_at <= done.started_at <= done.finished_at
    assert len(done.worker_ids) == 1 and done.attempts == 1 and done.errors == []
    assert not Job.objects.filter(id=result.id).exists()
    assert TaskResultRecord.objects.filter(id=result.id).exists()
    result.refresh()
    assert result.status == Status.SUCCESSFUL and result.return_value == done.return_value


def test_a_failure_is_retried_with_its_error_then_fails():
    result = tasks.fail.enqueue("boom")
    assert rws.tick() is True
    retried = backend().get_result(result.id)
    assert retried.status == Status.READY
    assert [e.exception_class for e in retried.errors] == [ValueError]
    assert "ValueError: boom" in retried.errors[0].traceback
    job = Job.objects.get(id=result.id)
    assert (job.status, job.attempts) == ("pending", 1) and job.last_error == "ValueError: boom"
    for _ in range(3):
        make_due()
        assert rws.tick() is True
    failed = backend().get_result(result.id)
    assert failed.status == Status.FAILED and len(failed.errors) == 4 and failed.attempts == 4
    assert failed.finished_at is not None
    with pytest.raises(ValueError, match="Task failed"):
        _ = failed.return_value
    assert [j.id for j in rws.failed_jobs()] == [result.id]


def test_a_dead_task_can_be_retried_from_the_dead_letter_list():
    result = tasks.once.enqueue("boom")
    assert rws.tick() is True
    assert backend().get_result(result.id).status == Status.FAILED
    assert rws.retry(result.id) is True
    again = backend().get_result(result.id)
    assert again.status == Status.READY and again.errors == []
    assert rws.delete(result.id) is True


def test_context_attempts_count_from_one_through_retries(runs):
    result = tasks.attempts.enqueue(3)
    for _ in range(3):
        make_due()
        assert rws.tick() is True
    assert [p for _, p in runs("attempt")] == ["1", "2", "3"]
    done = backend().get_result(result.id)
    assert done.status == Status.SUCCESSFUL and done.return_value == 3
    assert len(done.errors) == 2 and done.attempts == 3


def test_an_async_task_runs_to_completion():
    result = tasks.asleep.enqueue(0.01)
    assert rws.tick() is True
    assert backend().get_result(result.id).return_value == "awake"


def test_an_unserialisable_return_value_is_a_failure():
    result = tasks.unserialisable.enqueue()
    assert rws.tick() is True
    got = backend().get_result(result.id)
    assert got.status == Status.READY
    assert got.errors[0].exception_class is TypeError


def test_max_attempts_per_task_and_per_backend():
    once = tasks.once.enqueue("x")
    assert Job.objects.get(id=once.id).max_retries == 0
    with override_settings(TASKS={"default": {**_settings(), "OPTIONS": {"MAX_ATTEMPTS": 2}}}):
        two = tasks.fail.enqueue("x")
        assert Job.objects.get(id=two.id).max_retries == 1
    with override_settings(RWS_JOBS={"MAX_RETRIES": 5}):
        six = tasks.fail.enqueue("x")
        assert Job.objects.get(id=six.id).max_retries == 5


def _settings():
    from django.conf import settings

    return settings.TASKS["default"]


def test_a_unique_task_is_enqueued_once_while_it_waits():
    first = tasks.unique.enqueue("k")
    second = tasks.unique.enqueue("k")
    other = tasks.unique.enqueue("other")
    assert second.id == first.id and other.id != first.id
    assert Job.objects.count() == 2


def test_signals_are_sent_once_for_the_final_outcome():
    seen = []

    def started(sender, task_result, **kwargs):
        seen.append(("started", task_result.status))

    def finished(sender, task_result, **kwargs):
        seen.append(("finished", task_result.status))
        raise RuntimeError("a receiver that raises stops nothing")

    tasks_api.task_started.connect(started)
    tasks_api.task_finished.connect(finished)
    try:
        result = tasks.attempts.enqueue(2)
        assert rws.tick() is True
        make_due()
        assert rws.tick() is True
    finally:
        tasks_api.task_started.disconnect(started)
        tasks_api.task_finished.disconnect(finished)
    assert seen == [("started", Status.RUNNING), ("started", Status.RUNNING), ("finished", Status.SUCCESSFUL)]
    assert backend().get_result(result.id).status == Status.SUCCESSFUL


def test_a_running_task_shows_its_worker():
    from django.db import connection

    from django_rws_jobs.queue.store import Store

    result = tasks.record.enqueue("x")
    now = int(time.time())
    Store(connection).claim("host:1:abc#5", now, now + 60, None, 1)
    running = backend().get_result(result.id)
    assert running.status == Status.RUNNING and running.worker_ids == ["host:1:abc"]
    assert running.started_at is not None and running.last_attempted_at is not None


def test_a_late_result_writes_nothing():
    from django.db import connection

    from django_rws_jobs.attempts.outcomes import record
    from django_rws_jobs.attempts.run import execute
    from django_rws_jobs.queue.store import Store

    result = tasks.record.enqueue("late")
    store = Store(connection)
    now = int(time.time())
    (mine,) = store.claim("worker-a#1", now, now + 60, None, 1)
    outcome, _ = execute(mine)
    Job.objects.filter(id=result.id).update(locked_by="worker-b#7")
    assert record(store, mine, outcome, None) == "lost"
    assert not TaskResultRecord.objects.exists()
    assert Job.objects.get(id=result.id).locked_by == "worker-b#7"


def test_recovery_records_a_worker_lost_error():
    from django.db import connection

    from django_rws_jobs.attempts.outcomes import recover
    from django_rws_jobs.queue.store import Store
    from django_rws_jobs.tasks.errors import WorkerLost

    result = tasks.record.enqueue("lost")
    store = Store(connection)
    now = int(time.time())
    assert len(store.claim("gone:1:x#1", now, now - 60, None, 1)) == 1  # a lease already run out
    assert recover(store, now) == 1
    got = backend().get_result(result.id)
    assert got.status == Status.READY and got.worker_ids == ["gone:1:x"]
    assert [e.exception_class for e in got.errors] == [WorkerLost]


def test_check_reports_bad_options():
    b = RwsJobsBackend("x", {"QUEUES": ["ok", "bad,name"], "OPTIONS": {"MAX_ATTEMPTS": 0, "NOPE": 1}})
    ids = sorted(m.id for m in b.check())
    assert ids == ["rws_jobs.E201", "rws_jobs.E202", "rws_jobs.E205"]
    assert backend().check() == []


def test_check_reports_the_app_missing_from_installed_apps():
    """Without the app its tables are never migrated and the first enqueue would fail on them."""
    from django.test import modify_settings

    with modify_settings(INSTALLED_APPS={"remove": ["django_rws_jobs"]}):
        messages = backend().check()
    assert [m.id for m in messages] == ["rws_jobs.E206"]
    assert "INSTALLED_APPS" in messages[0].msg
    assert backend().check() == []


def test_the_async_twins():
    from asgiref.sync import async_to_sync

    async def enqueue_and_get():
        result = await tasks.record.aenqueue("async")
        return result, await tasks.record.aget_result(result.id)

    result, got = async_to_sync(enqueue_and_get)()
    assert got == result
    assert rws.tick() is True
    async_to_sync(result.arefresh)()
    assert result.status == Status.SUCCESSFUL


def test_the_history_is_capped():
    from django_rws_jobs.tasks import history

    past: dict = {}
    for n in range(1, 30):
        error = {"exception_class_path": "builtins.ValueError", "traceback": f"{n}:" + "x" * 20_000}
        past = history.after_attempt(past, f"w{n}", float(n), n + 0.5, error)
    assert len(past["errors"]) == history.MAX_ERRORS and past["errors"][-1]["traceback"].startswith("29:")
    assert all(len(e["traceback"]) <= history.MAX_TRACEBACK for e in past["errors"])
    assert past["worker_ids"] == [f"w{n}" for n in range(1, 30)]
    assert (past["started_at"], past["last_attempted_at"], past["finished_at"]) == (1.0, 29.0, 29.5)


def test_the_admins_retry_action_puts_a_dead_task_back(admin_client):
    from django.urls import reverse

    result = tasks.once.enqueue("boom")
    assert rws.tick() is True
    response = admin_client.post(
        reverse("admin:django_rws_jobs_failedjob_changelist"),
        {"action": "retry_selected", "_selected_action": [result.id]},
    )
    assert response.status_code == 302
    again = backend().get_result(result.id)
    assert again.status == Status.READY and again.errors == [] and again.attempts == 0


def test_what_the_queue_refuses_is_invalid_task_too():
    long_name = "q" * 65
    with override_settings(TASKS={"default": {**_settings(), "QUEUES": []}}):  # any queue, for Django
        with pytest.raises(InvalidTask, match="64"):
            tasks.record.using(queue_name=long_name).enqueue("x")
    assert Job.objects.count() == 0


@pytest.mark.parametrize(
    ("value", "words"),
    [(0, "timeout 0 is out of range; it must be above 0"), ("5", "timeout must be a number of seconds")],
)
def test_a_bad_task_timeout_is_invalid_task_naming_the_value(value, words):
    with pytest.raises(InvalidTask, match=words):
        tasks.record.with_options(timeout=value).enqueue("x")
    assert Job.objects.count() == 0
    ok = tasks.record.with_options(timeout=2).enqueue("y")
    assert Job.objects.get(id=ok.id).timeout == 2.0


def test_arguments_json_cannot_carry_raise_djangos_exception_types_too():
    """InvalidTask, and the TypeError / ValueError Django's own backends raise for them."""
    with pytest.raises(TypeError, match="Unsupported type") as info:
        tasks.record.enqueue(dt.datetime(2026, 1, 1))
    assert isinstance(info.value, InvalidTask)
    with pytest.raises(ValueError) as info:
        tasks.record.enqueue(b"\xff")
    assert isinstance(info.value, InvalidTask)
    assert Job.objects.count() == 0


@pytest.mark.parametrize("priority", [1.0, True])
def test_a_whole_number_priority_of_another_type_is_stored_as_one(priority):
    result = tasks.record.using(priority=priority).enqueue("x")
    assert Job.objects.get(id=result.id).priority == 1
    assert backend().get_result(result.id).task.priority == 1


def test_a_task_its_module_path_does_not_name_is_refused_at_enqueue():
    """The worker and get_result find a task by its module path: one that names a plain function
    (or another task) would be enqueued and then never run."""
    from tests.testapp.tasks import task

    made_late = task(tasks.plain)
    with pytest.raises(InvalidTask, match="not a task"):
        made_late.enqueue("x")
    assert Job.objects.count() == 0


@pytest.mark.parametrize("name", ["a,b", " x", "q" * 65])
def test_a_queue_name_the_queue_refuses_is_invalid_when_the_task_is_made(name):
    with override_settings(TASKS={"default": {**_settings(), "QUEUES": []}}):  # any queue, for Django
        with pytest.raises(InvalidTask):
            tasks.record.using(queue_name=name)


def test_with_options_changes_are_in_the_task_get_result_gives():
    """enqueue's result equals what get_result returns, also for a task whose own options
    with_options changed (the declared task has none of them)."""
    changed = tasks.unique.with_options(max_attempts=2, timeout=5)
    result = changed.enqueue("k")
    again = backend().get_result(result.id)
    assert (again.task.max_attempts, again.task.timeout, again.task.unique) == (2, 5, True)
    assert again == result
    plain = backend().get_result(tasks.unique.enqueue("other").id)
    assert (plain.task.max_attempts, plain.task.timeout) == (None, None)


def test_djangos_log_of_a_failed_task_has_its_traceback(caplog):
    """task_finished of a FAILED task is sent while its exception is handled, as ImmediateBackend
    sends it, so Django's own receiver logs it with exc_info."""
    import logging

    framework = "django.tasks" if tasks_api.Task.__module__.startswith("django.") else "django_tasks"
    result = tasks.once.enqueue("boom")
    with caplog.at_level(logging.INFO, logger=framework):
        assert rws.tick() is True
    failed = [r for r in caplog.records if r.name == framework and r.levelno == logging.ERROR]
    assert len(failed) == 1 and result.id in failed[0].getMessage()
    assert failed[0].exc_info is not None and failed[0].exc_info[0] is ValueError
    assert "boom" in caplog.text


def test_get_result_finds_only_its_own_backends_tasks():
    """Two backends on one database: each finds the tasks enqueued through it, waiting or
    finished, and not the other's, as django-tasks-db's backend filters on its name."""
    both = {"default": _settings(), "other": {**_settings(), "QUEUES": []}}
    with override_settings(TASKS=both):
        mine = tasks.record.enqueue("mine")
        theirs = tasks.record.using(backend="other").enqueue("theirs")
        assert theirs.backend == "other"
        for _ in range(2):  # waiting, then finished (the result row)
            assert backend().get_result(mine.id).id == mine.id
            assert tasks_api.task_backends["other"].get_result(theirs.id).backend == "other"
            with pytest.raises(TaskResultDoesNotExist):
                backend().get_result(theirs.id)
            with pytest.raises(TaskResultDoesNotExist):
                tasks_api.task_backends["other"].get_result(mine.id)
            make_due()
            while rws.tick():
                pass
        assert TaskResultRecord.objects.count() == 2
