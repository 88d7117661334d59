"""django.tasks tasks under ``rws_worker --pool processes``: the child's answer carries the task's
outcome, whose TaskResult holds the task's function (worker/child.py's TaskPickler)."""

import pytest

tasks_api = pytest.importorskip("django_rws_jobs.tasks.compat")

from tests.test_worker import WorkerProcess  # noqa: E402
from tests.testapp import tasks  # noqa: E402

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

Status = tasks_api.TaskResultStatus


def get(result_id):
    return tasks_api.task_backends["default"].get_result(result_id)


def test_a_task_in_a_child_process_ends_as_it_returned(tmp_path, started):
    """A success reads SUCCESSFUL with its return value, a failure its own error: the child's
    answers reach the worker, no child is lost."""
    ok = tasks.record.enqueue("in a child")
    bad = tasks.once.enqueue("its own error")
    w = WorkerProcess(tmp_path, "--pool", "processes", "--burst")
    started.append(w)
    assert w.wait(60) == 0, w.output()
    done = get(ok.id)
    assert done.status == Status.SUCCESSFUL, (done.errors, w.output())
    assert done.return_value["payload"] == "in a child" and done.return_value["pid"] != w.proc.pid
    failed = get(bad.id)
    assert failed.status == Status.FAILED
    assert [e.exception_class for e in failed.errors] == [ValueError], failed.errors
    assert "0 child processes lost" in w.output(), w.output()
