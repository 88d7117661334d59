"""A django.tasks task decides its attempt's outcome as a handler does (Snooze, Retry, Fail,
Cancel), with ``rws_task(backoff=, fail_on=)``: by tick() here, and in worker processes of both
pools at the end."""

import math

import pytest

tasks_api = pytest.importorskip("django_rws_jobs.tasks.compat")

import django_rws_jobs as rws  # noqa: E402
from django_rws_jobs.database import clock  # noqa: E402
from django_rws_jobs.models import Job  # noqa: E402
from django_rws_jobs.tasks import RwsJobsBackend  # noqa: E402
from django_rws_jobs.tasks import task as rws_task  # noqa: E402
from tests.test_worker import workers  # noqa: E402, F401  (a fixture)
from tests.testapp import tasks  # noqa: E402

Status = tasks_api.TaskResultStatus
InvalidTask = tasks_api.InvalidTask

pytestmark = pytest.mark.django_db(transaction=True)


def result_of(result_id: str):
    backend: RwsJobsBackend = tasks.decide.get_backend()
    return backend.get_result(result_id)


def run_task(payload: str, task=tasks.decide) -> tuple[Job, float, float]:
    result = task.enqueue(payload)
    before = clock.now()
    assert rws.tick() is True
    after = clock.now()
    return Job.objects.get(id=result.id), before, after


def test_a_snoozed_task_waits_uncharged_and_its_result_stays_ready():
    job, before, after = run_task("snooze 30")
    assert (job.status, job.attempts, job.snoozes) == ("pending", 0, 1)
    assert math.ceil(before + 30) <= job.next_run_at <= math.ceil(after + 30)
    result = result_of(job.id)
    assert result.status == Status.READY and result.errors == []


def test_a_task_retry_is_exact_and_its_type_backoff_is_its_own():
    job, before, after = run_task("retry 120 slow")
    assert (job.status, job.attempts) == ("pending", 1) and job.last_error.endswith("Retry: slow")
    assert math.ceil(before + 120) <= job.next_run_at <= math.ceil(after + 120)
    plain, before, after = run_task("error")  # backoff={"initial": 40, "jitter": 0}
    assert plain.attempts == 1 and math.ceil(before + 40) <= plain.next_run_at <= math.ceil(after + 40)


@pytest.mark.parametrize("payload", ["fail gone", "lookup k"])
def test_fail_and_fail_on_end_a_task_dead(payload):
    job, _, _ = run_task(payload)
    assert (job.status, job.attempts) == ("failed", 1)  # max_attempts=4: three were left
    assert result_of(job.id).status == Status.FAILED


def test_a_cancelled_task_ends_cancelled_by_its_handler():
    job, _, _ = run_task("cancel obsolete")
    assert (job.status, job.cancelled_by, job.last_error) == ("cancelled", "handler", "Cancel: obsolete")


def test_bad_task_outcome_options_are_invalid_tasks():
    with pytest.raises(InvalidTask, match=r"backoff has unknown key\(s\) \['start'\]"):
        rws_task(backoff={"start": 1})(tasks.record.func)
    with pytest.raises(InvalidTask, match="fail_on must be exception classes"):
        rws_task(fail_on=3)(tasks.record.func)


DECISIONS = ["snooze 3600", "retry 3600 slow down", "fail gone", "cancel obsolete", "catch"]


@pytest.mark.slow
@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_each_decision_in_a_task(workers, pool):  # noqa: F811
    ids = {}
    for task in (tasks.decide, tasks.async_decide):
        for payload in DECISIONS:
            ids[task.name, payload] = task.enqueue(payload).id
    w = workers("--workers", "2", "--pool", pool, "--burst", "--no-schedules")
    assert w.wait() == 0, w.output()
    for task in (tasks.decide, tasks.async_decide):
        rows = {p: Job.objects.filter(id=ids[task.name, p]).first() for p in DECISIONS}
        snoozed, retried, failed, cancelled = (rows[p] for p in DECISIONS[:4])
        assert (snoozed.status, snoozed.attempts, snoozed.snoozes) == ("pending", 0, 1), task.name
        assert (retried.status, retried.attempts) == ("pending", 1)
        assert retried.last_error.endswith("Retry: slow down")
        assert (failed.status, failed.attempts) == ("failed", 1)
        assert (cancelled.status, cancelled.cancelled_by) == ("cancelled", "handler")
        assert rows["catch"] is None  # succeeded: its row deleted, its result kept
        assert result_of(ids[task.name, "catch"]).status == Status.SUCCESSFUL
