"""RWS_JOBS["MIDDLEWARE"]: classes around enqueue and execute (queue/middleware.py)."""

from __future__ import annotations

import json

import pytest
from django.db import transaction

import django_rws_jobs as rws
from django_rws_jobs.models import Job, Status
from tests.test_worker import wait_for, workers  # noqa: F401  (a fixture)
from tests.testapp import middleware
from tests.testapp.models import Run

pytestmark = pytest.mark.django_db(transaction=True)

M = "tests.testapp.middleware."


@pytest.fixture
def use(settings):
    middleware.EVENTS.clear()

    def configure(*names: str) -> None:
        settings.RWS_JOBS = {**settings.RWS_JOBS, "MIDDLEWARE": [M + n for n in names]}

    yield configure
    middleware.EVENTS.clear()


def test_the_first_middleware_is_the_outermost(use):
    use("Outer", "Tenant")
    job_id = rws.enqueue("test.record", "x", metadata={"own": 1})
    assert middleware.EVENTS == [
        ("outer enqueue", "test.record", False),
        ("tenant enqueue", "test.record", False),
        ("tenant enqueued", [job_id]),
        ("outer enqueued", [job_id]),
    ]
    assert Job.objects.get(id=job_id).metadata == {"own": 1, "tenant": "acme"}
    middleware.EVENTS.clear()
    assert rws.tick()
    assert middleware.EVENTS == [
        ("outer execute", job_id),
        ("tenant execute", job_id),
        ("outer executed", job_id),
    ]
    assert [
        json.loads(p) for p in Run.objects.filter(kind="middleware").values_list("payload", flat=True)
    ] == [[job_id, "acme"]]


def test_enqueue_many_is_one_call_whose_metadata_each_job_gets_under_its_own(use):
    use("Tenant")
    ids = rws.enqueue_many(["test.record", {"job_type": "test.record", "metadata": {"tenant": "mine"}}])
    assert middleware.EVENTS == [("tenant enqueue", None, True), ("tenant enqueued", ids)]
    assert [Job.objects.get(id=i).metadata for i in ids] == [{"tenant": "acme"}, {"tenant": "mine"}]


def test_a_chain_and_a_batchs_enqueue_many_go_through_the_middleware(use):
    use("Tenant")
    ids = rws.chain(rws.call("test.record", "a"), rws.call("test.record", "b", metadata={"x": 1}))
    assert [Job.objects.get(id=i).metadata for i in ids] == [{"tenant": "acme"}, {"tenant": "acme", "x": 1}]
    with rws.batch() as b:
        more = b.enqueue_many(["test.record"])
    assert Job.objects.get(id=more[0]).metadata == {"tenant": "acme"}


def test_an_enqueue_middleware_that_raises_is_the_callers_exception_and_stores_nothing(use):
    use("Tenant", "Refuse")
    with pytest.raises(PermissionError, match="refused by the middleware"):
        rws.enqueue("test.record", "x", metadata={"refuse": True})
    assert not Job.objects.exists()


def _enqueue_one_way(call: str) -> None:
    if call == "enqueue":
        rws.enqueue("test.record", "x")
    elif call == "enqueue_many":
        rws.enqueue_many(["test.record", ("test.record", "y")])
    elif call == "chain":
        rws.chain(rws.call("test.record", "a"), rws.call("test.record", "b"))
    else:
        from tests.testapp.tasks import tagged

        tagged.enqueue()


@pytest.mark.parametrize("call", ["enqueue", "enqueue_many", "chain", "task"])
def test_an_enqueue_middleware_that_raises_after_call_next_stores_nothing(use, call):
    """call_next() stored the jobs; the raise after it takes them back: outside a transaction
    (autocommit) and inside one that goes on and commits."""
    use("Tenant", "RefuseAfter")
    with pytest.raises(PermissionError, match=r"refused after call_next\(\)"):
        _enqueue_one_way(call)
    assert [e[0] for e in middleware.EVENTS] == ["tenant enqueue", "refuse after"]
    assert middleware.EVENTS[-1][1]  # the ids call_next() stored
    assert not Job.objects.exists()
    with transaction.atomic():
        Run.objects.create(kind="mine", payload="", pid=0)
        with pytest.raises(PermissionError):
            _enqueue_one_way(call)
    assert not Job.objects.exists()
    assert Run.objects.filter(kind="mine").count() == 1  # the caller's own work committed


def test_an_execute_middleware_that_raises_is_the_attempts_failure(use):
    use("Refuse")
    job_id = rws.enqueue("test.record", "x", metadata={"fail": True}, max_retries=0)
    assert rws.tick()
    job = Job.objects.get(id=job_id)
    assert job.status == Status.FAILED
    assert job.last_error == "PermissionError: failed by the middleware"
    assert not Run.objects.filter(kind="record").exists()  # the handler did not run


def test_a_middleware_may_define_only_one_method(use):
    use("OnlyExecute")
    job_id = rws.enqueue("test.record", "x")
    assert middleware.EVENTS == []
    assert rws.tick()
    assert middleware.EVENTS == [("only execute", job_id)]


def test_a_task_goes_through_the_middleware(use):
    from tests.testapp.tasks import tagged

    use("Tenant")
    result = tagged.enqueue()
    assert result.metadata == {"tenant": "acme"}
    assert middleware.EVENTS[0] == ("tenant enqueue", "django.tasks:tests.testapp.tasks.tagged", False)
    assert rws.tick()
    assert ("tenant execute", result.id) in middleware.EVENTS
    assert tagged.get_result(result.id).return_value == {"tenant": "acme"}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("tests.testapp.middleware.Outer", "a list of dotted paths to classes"),
        (["tests.testapp.middleware.Missing"], "a list of dotted paths to classes"),
        (["tests.testapp.middleware.EVENTS"], "a list of dotted paths to classes"),
    ],
)
def test_a_bad_middleware_setting_is_a_check_error(settings, value, message):
    from django_rws_jobs.checks import check_settings

    settings.RWS_JOBS = {**settings.RWS_JOBS, "MIDDLEWARE": value}
    found = [m for m in check_settings() if m.id == "rws_jobs.E029"]
    assert len(found) == 1 and message in found[0].msg


@pytest.mark.slow
@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_a_worker_runs_each_job_inside_the_middleware(workers, pool):  # noqa: F811
    ids = [rws.enqueue("test.record", str(i), metadata={"tenant": f"t{i}"}) for i in range(6)]
    failing = rws.enqueue("test.record", "f", metadata={"fail": True}, max_retries=0)
    w = workers(
        "--workers", "2", "--pool", pool, "--burst", jobs={"MIDDLEWARE": [M + "Tenant", M + "Refuse"]}
    )
    assert w.wait() == 0, w.output()
    seen = sorted(
        json.loads(p) for p in Run.objects.filter(kind="middleware").values_list("payload", flat=True)
    )
    assert seen == sorted([[i, f"t{n}"] for n, i in enumerate(ids)] + [[failing, None]])
    assert Job.objects.get(id=failing).last_error == "PermissionError: failed by the middleware"
