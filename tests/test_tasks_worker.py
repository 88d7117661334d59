"""django.tasks rows run by real rws_worker processes: each task once across workers, SIGTERM lets
a running task finish, kill -9 is recovered with a WorkerLost error."""

import signal
from collections import Counter

import pytest

tasks_api = pytest.importorskip("django_rws_jobs.tasks.compat")

import django_rws_jobs as rws  # noqa: E402
from django_rws_jobs.models import Job, TaskResultRecord  # noqa: E402
from django_rws_jobs.tasks.errors import WorkerLost  # noqa: E402
from tests import test_worker  # noqa: E402
from tests.testapp import tasks  # noqa: E402
from tests.testapp.models import Run  # noqa: E402

Status = tasks_api.TaskResultStatus
workers = test_worker.workers  # the fixture: real rws_worker processes, killed at the end
wait_for = test_worker.wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def get(result_id):
    return tasks_api.task_backends["default"].get_result(result_id)


def test_several_workers_run_each_task_once_beside_jobs(workers):
    results = [tasks.record.enqueue(str(i)) for i in range(150)]
    for i in range(50):
        rws.enqueue("test.record", f"job-{i}")
    procs = [workers("--workers", "4", "--burst") for _ in range(3)]
    for w in procs:
        assert w.wait(120) == 0, w.output()
        assert "Traceback" not in w.output(), w.output()
    counts = Counter(Run.objects.filter(kind="task").values_list("payload", flat=True))
    assert sorted(counts) == sorted(str(i) for i in range(150)) and set(counts.values()) == {1}
    assert Run.objects.filter(kind="record").count() == 50
    assert Job.objects.count() == 0 and TaskResultRecord.objects.count() == 150
    done = [get(r.id) for r in results[:10]]
    assert {d.status for d in done} == {Status.SUCCESSFUL}
    assert all(d.return_value["payload"] == r.args[0] for d, r in zip(done, results[:10], strict=True))


def test_retries_and_the_dead_letter_list_in_a_worker(workers):
    flaky = tasks.attempts.enqueue(2)
    dead = tasks.once.enqueue("never")
    w = workers("--workers", "2", jobs={"BACKOFF_INITIAL": 0.1})
    wait_for(lambda: get(flaky.id).status == Status.SUCCESSFUL, what="the flaky task to succeed")
    wait_for(lambda: get(dead.id).status == Status.FAILED, what="the failing task to fail")
    w.signal(signal.SIGTERM)
    assert w.wait() == 0, w.output()
    assert get(flaky.id).return_value == 2 and len(get(flaky.id).errors) == 1
    assert [j.id for j in rws.failed_jobs()] == [dead.id]


def test_sigterm_lets_a_running_task_finish(workers):
    result = tasks.sleep.enqueue(1.5)
    w = workers("--workers", "2")
    wait_for(lambda: Run.objects.filter(kind="task-start").exists(), what="the task to start")
    assert get(result.id).status == Status.RUNNING
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0, w.output()
    done = get(result.id)
    assert done.status == Status.SUCCESSFUL and done.return_value == 1.5
    assert Run.objects.filter(kind="task-end").count() == 1


def test_kill_9_is_recovered_with_a_worker_lost_error(workers):
    result = tasks.sleep.enqueue(1.0)
    fast = {"LEASE_SECONDS": 2, "RECOVERY_INTERVAL": 0.5, "BACKOFF_INITIAL": 0.1}
    victim = workers("--workers", "1", jobs=fast)
    wait_for(lambda: Run.objects.filter(kind="task-start").exists(), what="the task to start")
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait()
    rescuer = workers("--workers", "1", jobs=fast)
    wait_for(lambda: get(result.id).status == Status.SUCCESSFUL, timeout=60, what="the task to finish")
    rescuer.signal(signal.SIGTERM)
    assert rescuer.wait() == 0, rescuer.output()
    done = get(result.id)
    assert [e.exception_class for e in done.errors] == [WorkerLost]
    assert len(done.worker_ids) == 2 and done.worker_ids[0] != done.worker_ids[1]


@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_a_task_past_its_timeout_fails_with_job_timeout(workers, pool):
    from django_rws_jobs import JobTimeout

    result = tasks.spin.enqueue("stuck")
    assert Job.objects.get(id=result.id).timeout == 0.5  # @rws_task(timeout=0.5): the row's own limit
    w = workers("--workers", "2", "--pool", pool, jobs={"BACKOFF_INITIAL": 0.1, "TIMEOUT_GRACE": 1})
    wait_for(lambda: get(result.id).status == Status.FAILED, timeout=30, what="both attempts to time out")
    w.signal(signal.SIGTERM)
    assert w.wait() == 0, w.output()
    done = get(result.id)
    assert [e.exception_class for e in done.errors] == [JobTimeout, JobTimeout]
    assert "ran longer than 0.5 s" in done.errors[-1].traceback
    assert Run.objects.filter(kind="task-spin").count() == 2
    assert [j.id for j in rws.failed_jobs()] == [result.id]
