import time

import pytest

import django_rws_jobs as rws
from django_rws_jobs.models import Job

pytestmark = pytest.mark.django_db(transaction=True)


def make(status="pending", **kw):
    job_id = rws.enqueue(kw.pop("job_type", "x"), **kw)
    if status != "pending":
        digest = None if status == "failed" else Job.objects.get(id=job_id).unique_hash
        Job.objects.filter(id=job_id).update(status=status, attempts=4, unique_hash=digest)
    return job_id


def test_jobs_lists_in_queue_order_with_status_and_limit():
    a = make(priority=1)
    b = make(priority=5)
    c = make("failed")
    assert [j.id for j in rws.jobs()] == [b, a, c]
    assert all(isinstance(j, Job) for j in rws.jobs())
    assert [j.id for j in rws.jobs("pending")] == [b, a]
    assert [j.id for j in rws.jobs(limit=1)] == [b]
    assert rws.jobs(limit=0) == []
    assert [j.id for j in rws.failed_jobs()] == [c]


def test_jobs_rejects_bad_status_and_limit():
    with pytest.raises(ValueError, match="status 'done' is not one of pending, running, failed"):
        rws.jobs("done")
    with pytest.raises(ValueError, match="limit -1 is out of range"):
        rws.jobs(limit=-1)
    with pytest.raises(TypeError, match="limit must be an int"):
        rws.failed_jobs(limit="10")


def test_retry_puts_a_failed_job_back_due_now():
    job_id = make("failed")
    Job.objects.filter(id=job_id).update(next_run_at=1, last_error="E: x", failed_at=5)
    before = int(time.time())
    assert rws.retry(job_id) is True
    job = Job.objects.get(id=job_id)
    assert (job.status, job.attempts, job.failed_at) == ("pending", 0, None)
    assert before <= job.next_run_at <= int(time.time())
    assert rws.retry(job_id) is False  # no longer failed


def test_retry_is_false_for_missing_pending_and_running_jobs():
    assert rws.retry("no-such-id") is False
    assert rws.retry(make()) is False
    assert rws.retry(make("running")) is False


def test_retry_refuses_to_break_a_unique_key():
    dead = make("failed", unique="k")
    alive = rws.enqueue("x", unique="k")
    assert alive != dead
    assert rws.retry(dead) is False
    assert Job.objects.get(id=dead).status == "failed"
    Job.objects.filter(id=alive).delete()
    assert rws.retry(dead) is True
    assert rws.enqueue("x", unique="k") == dead  # holds its key again


@pytest.mark.parametrize("how", ["retry", "retry_many"])
def test_a_failed_job_holding_the_key_does_not_block_a_retry(how):
    """A rust-web-server writer leaves unique_hash set on a job that fails; only a pending or
    running job holds its key, so another dead job of the same key can be retried."""
    from django_rws_jobs.api.dead_letters import retry_many
    from django_rws_jobs.api.enqueue import unique_hash

    first = make("failed", unique="k")
    second = make("failed", unique="k")
    digest = unique_hash("x", "k")
    Job.objects.filter(id=second).update(unique_hash=digest)  # as the crate leaves it
    if how == "retry":
        assert rws.retry(first) is True
    else:
        assert retry_many([first]) == ([first], [])
    rows = dict(Job.objects.values_list("id", "unique_hash"))
    assert rows == {first: digest, second: None}
    assert rws.retry(second) is False  # now the retried one holds the key


def test_delete_removes_jobs_that_are_not_running():
    p, f, r = make(), make("failed"), make("running")
    assert rws.delete(p) is True and rws.delete(f) is True
    assert rws.delete(r) is False
    assert rws.delete("no-such-id") is False
    assert list(Job.objects.values_list("id", flat=True)) == [r]


def test_a_delete_keeps_its_status_condition_with_delete_receivers():
    """With any pre/post_delete receiver connected, QuerySet.delete() reads the rows, then deletes
    them by primary key alone: a job a worker claims in between was deleted while running. Here
    the receiver plays that worker. Deletes are one statement that keeps its status condition."""
    from django.db.models.signals import post_delete, pre_delete

    from django_rws_jobs.api.dead_letters import delete_where
    from django_rws_jobs.models import Status

    calls = []

    def claim_in_between(sender, instance, **kwargs):
        calls.append(instance.pk)
        Job.objects.filter(pk=instance.pk).update(status="running", locked_by="w#1")

    pre_delete.connect(claim_in_between, dispatch_uid="rws-test-claim")
    post_delete.connect(claim_in_between, dispatch_uid="rws-test-claim-post")
    try:
        pending, dead = make(), make("failed")
        assert rws.delete(pending) is True
        assert delete_where(Job.objects.filter(pk=dead, status=Status.FAILED)) == 1
        running = make("running")
        assert rws.delete(running) is False
    finally:
        pre_delete.disconnect(dispatch_uid="rws-test-claim")
        post_delete.disconnect(dispatch_uid="rws-test-claim-post")
    assert calls == []
    assert list(Job.objects.values_list("id", "status")) == [(running, "running")]
