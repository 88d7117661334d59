"""current_job(): a handler sees its own job (id, job_type, queue, attempt) in the thread pool,
an ``async def`` handler, the process pool's child, ``tick()`` and a django.tasks task, and None
outside a handler."""

from __future__ import annotations

import json
import threading

import pytest
from django.db import connections

import django_rws_jobs as rws
from django_rws_jobs.models import Job
from tests.test_worker import workers  # noqa: F401  (a fixture)
from tests.testapp.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


def seen() -> dict[str, dict]:
    """What each whoami run recorded, by the label it was given."""
    return {
        r["label"]: r
        for r in (json.loads(p) for p in Run.objects.filter(kind="whoami").values_list("payload", flat=True))
    }


def test_outside_a_handler_there_is_no_current_job():
    assert rws.current_job() is None
    rws.enqueue("test.whoami", "a")
    assert rws.current_job() is None  # enqueueing is not running


@pytest.mark.parametrize("job_type", ["test.whoami", "test.whoami_async"])
def test_tick_runs_the_handler_with_its_job(job_type):
    job_id = rws.enqueue(job_type, "a", queue="q1")
    assert rws.tick()
    assert seen()["a"] == {"label": "a", "id": job_id, "job_type": job_type, "queue": "q1", "attempt": 1}
    assert rws.current_job() is None  # reset after the handler


def test_the_attempt_counts_the_runs():
    job_id = rws.enqueue("test.whoami", "fail-first", max_retries=2)
    assert rws.tick()  # fails
    assert Job.objects.get(id=job_id).attempts == 1
    Job.objects.filter(id=job_id).update(next_run_at=0)  # due again now
    assert rws.tick()
    assert [
        json.loads(p)["attempt"] for p in Run.objects.values_list("payload", flat=True).order_by("id")
    ] == [1, 2]
    assert not Job.objects.filter(id=job_id).exists()


def test_each_thread_sees_its_own_job():
    ids = {str(i): rws.enqueue("test.whoami", str(i)) for i in range(8)}

    def ticks() -> None:
        try:
            for _ in range(4):
                rws.tick()
        finally:
            # A thread's connections outlive it unless it closes them: left open, PostgreSQL
            # refuses to drop the test database at the session's end.
            connections.close_all()

    threads = [threading.Thread(target=ticks) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {label: r["id"] for label, r in seen().items()} == ids


def test_a_task_sees_its_job():
    pytest.importorskip("django_rws_jobs.tasks.compat")
    from tests.testapp.tasks import whoami

    result = whoami.enqueue()
    assert rws.tick()
    got = whoami.get_result(result.id)
    assert got.return_value == {
        "job_type": f"django.tasks:{whoami.module_path}",
        "attempt": 1,
        "queue": "default",
    }


@pytest.mark.slow
@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_a_worker_gives_each_handler_its_own_job(workers, pool):  # noqa: F811
    ids = {}
    for i in range(40):
        job_type = "test.whoami_async" if i % 2 else "test.whoami"
        ids[str(i)] = (rws.enqueue(job_type, str(i), queue=f"q{i % 3}"), job_type, f"q{i % 3}")
    w = workers("--workers", "4", "--pool", pool, "--burst")
    assert w.wait() == 0, w.output()
    got = seen()
    assert {label: (r["id"], r["job_type"], r["queue"]) for label, r in got.items()} == ids
    assert {r["attempt"] for r in got.values()} == {1}
