"""Jobs that wait for jobs and batches: enqueue(after=, on_dependency_failure=)."""

import contextvars
import sqlite3
import time
import uuid

import pytest
from django.db import connection, connections, transaction

import django_rws_jobs as rws
from django_rws_jobs.api.dead_letters import retry_many
from django_rws_jobs.database.connections import private_connection
from django_rws_jobs.models import Dependency, Job
from django_rws_jobs.queue.store import Store
from django_rws_jobs.workflows import batch_outcomes, dependency_outcomes
from tests.conftest import drain, short_lock_waits

pytestmark = pytest.mark.django_db(transaction=True)


def status(job_id: str) -> str | None:
    return Job.objects.filter(id=job_id).values_list("status", flat=True).first()


def test_a_chain_runs_in_order_and_a_blocked_job_is_never_claimed(runs):
    a = rws.enqueue("test.record", "a", priority=-5)
    b = rws.enqueue("test.record", "b", after=[a], priority=5)
    c = rws.enqueue("test.record", "c", after=[b], priority=9)
    assert (status(b), status(c)) == ("blocked", "blocked")
    assert drain() == 3
    assert runs() == [("record", "a"), ("record", "b"), ("record", "c")]
    assert Job.objects.count() == 0 and Dependency.objects.filter(outcome__isnull=True).count() == 0


def test_a_diamond_runs_its_join_last(runs):
    a = rws.enqueue("test.record", "a")
    b = rws.enqueue("test.record", "b", after=[a])
    c = rws.enqueue("test.record", "c", after=[a])
    rws.enqueue("test.record", "d", after=[b, c], priority=100)
    drain()
    order = [p for _, p in runs()]
    assert order[0] == "a" and order[-1] == "d" and sorted(order[1:3]) == ["b", "c"]


def test_a_job_after_a_finished_or_dead_job_is_decided_at_enqueue():
    gone = "01000000-0000-7000-8000-000000000000"  # no such row: it succeeded (and was deleted)
    assert status(rws.enqueue("test.record", "x", after=[gone])) == "pending"
    dead = rws.enqueue("test.fail", "x", max_retries=0)
    drain()
    assert status(rws.enqueue("test.record", "y", after=[dead])) == "cancelled"
    assert status(rws.enqueue("test.record", "z", after=[dead], on_dependency_failure="run")) == "pending"
    assert status(rws.enqueue("test.record", "w", after=[dead], on_dependency_failure="wait")) == "blocked"


@pytest.mark.parametrize("policy, then", [("cancel", "cancelled"), ("run", None), ("wait", "blocked")])
def test_each_policy_with_a_dependency_that_dies(policy, then, runs):
    dep = rws.enqueue("test.fail", "x", max_retries=0)
    job = rws.enqueue("test.record", "after", after=[dep], on_dependency_failure=policy)
    further = rws.enqueue("test.record", "further", after=[job])
    drain()
    assert status(dep) == "failed"
    assert status(job) == then  # None: it ran and succeeded (deleted)
    if policy == "cancel":
        assert status(further) == "cancelled"  # the cancel cascades
        assert "on_dependency_failure" in Job.objects.get(id=job).last_error
    elif policy == "run":
        assert [p for _, p in runs()] == ["after", "further"]
    else:
        assert status(further) == "blocked" and runs() == []


def test_wait_then_a_retry_that_succeeds_runs_the_job(runs):
    dep = rws.enqueue("test.fail", "x", max_retries=0)
    job = rws.enqueue("test.record", "after", after=[dep], on_dependency_failure="wait")
    drain()
    assert status(job) == "blocked"
    Job.objects.filter(id=dep).update(job_type="test.record")  # fixed; retried
    assert rws.retry(dep)
    drain()
    assert status(job) is None and [p for _, p in runs()] == ["x", "after"]


def test_a_job_after_a_whole_batch(runs):
    with rws.batch() as b:
        b.enqueue("test.record", "m1")
        b.enqueue("test.record", "m2")
    job = rws.enqueue("test.record", "report", after=[b], priority=100)
    assert status(job) == "blocked"
    drain()
    assert [p for _, p in runs()][-1] == "report"
    with rws.batch() as failing:
        failing.enqueue("test.fail", "x", max_retries=0)
    waiting = rws.enqueue("test.record", "r2", after=[rws.get_batch(failing.id)])
    drain()
    assert status(waiting) == "cancelled"


def test_a_job_after_a_cancelled_batch_is_cancelled():
    with rws.batch() as b:
        b.enqueue("test.record", "m")
    job = rws.enqueue("test.record", "after", after=[b])
    assert rws.get_batch(b.id).cancel()
    assert status(job) == "cancelled"


def test_cancelling_a_blocked_job_cascades():
    a = rws.enqueue("test.record", "a", run_in=3600)
    b = rws.enqueue("test.record", "b", after=[a])
    c = rws.enqueue("test.record", "c", after=[b])
    assert rws.cancel(b)
    assert (status(a), status(b), status(c)) == ("pending", "cancelled", "cancelled")


def test_a_dependent_enqueued_while_its_dependency_runs_is_released_by_that_worker(runs):
    """The handler enqueues a job after itself: the claim read no dependents, the deletion does."""
    rws.enqueue("test.enqueue_after_me", "next")
    assert rws.tick()  # runs the handler, then its deletion releases the dependent
    assert Job.objects.get().status == "pending"
    assert rws.tick() and runs() == [("record", "next")]


def test_a_job_waiting_for_a_dead_job_is_released_by_its_retry(runs):
    """The dependency died before the job began to wait: its retry's success, not the sweep,
    releases the job (the edge flags it whatever its status)."""
    dep = rws.enqueue("test.fail", "x", max_retries=0)
    drain()
    job = rws.enqueue("test.record", "after", after=[dep], on_dependency_failure="wait")
    assert status(job) == "blocked"
    Job.objects.filter(id=dep).update(job_type="test.record")  # fixed; retried
    assert rws.retry(dep)
    drain()
    assert status(job) is None and [p for _, p in runs()] == ["x", "after"]


@pytest.mark.skipif(
    connection.vendor == "sqlite", reason="SQLite: an open write transaction holds the whole file"
)
def test_an_open_enqueue_after_a_running_job_does_not_hold_its_worker():
    """A caller's transaction that enqueued after=[x, y] while they run stays open: their worker
    still renews its leases, finishes x, moves y to the dead-letter list and resolves what
    waited for them before (the rows the open transaction inserted are not in its way), and the
    enqueue's recheck after the commit catches that x and y ended meanwhile."""
    x = rws.enqueue("test.record", "x")
    y = rws.enqueue("test.fail", "y")
    earlier = rws.enqueue("test.record", "earlier", after=[x])  # committed: x's flag is set
    worker = private_connection("default")
    try:
        store = Store(worker)
        short_lock_waits(store)
        now = int(time.time())
        claimed = {job.id: job for job in store.claim("w#1", now, now + 60, None, 2)}
        assert set(claimed) == {x, y}
        with transaction.atomic():
            job = rws.enqueue("test.record", "after", after=[x, y])
            assert status(job) == "blocked"
            assert store.renew(["w#1"], now + 120) == 2  # raised a lock timeout before
            assert store.complete(claimed[x]) and claimed[x].has_dependents
            assert store.move_to_dead_letters(claimed[y], 1, "boom", None, now)
            batch_outcomes.settle(store, [(claimed[x], "done"), (claimed[y], "dead")], now)
            assert status(earlier) == "pending"  # (the worker's commit, seen from here)
        assert status(x) is None and status(y) == "failed" and status(job) == "cancelled"
    finally:
        worker.close()


@pytest.mark.parametrize("many", [False, True])
def test_a_retried_chain_runs_its_steps_in_order_again(many, runs):
    """Retrying a chain's dead step and its cancelled successors: each waits for the step before
    again (with higher priorities than it), one by one or all at once (retry_many)."""
    a, b, c = rws.chain(
        rws.call("test.fail", "a", max_retries=0, priority=-5),
        rws.call("test.record", "b", priority=5),
        rws.call("test.record", "c", priority=9),
    )
    drain()
    assert [status(i) for i in (a, b, c)] == ["failed", "cancelled", "cancelled"]
    assert rws.retry(b)  # a still dead: decided again, cancelled again
    assert status(b) == "cancelled"
    Job.objects.filter(id=a).update(job_type="test.record")  # fixed
    if many:
        Job.objects.filter(id__in=[b, c]).update(status="failed")  # as if they had died: retry_many's
        retried, held = retry_many([c, b, a])
        assert sorted(retried) == sorted([a, b, c]) and held == []
    else:
        assert rws.retry(a) and rws.retry(b) and rws.retry(c)
    assert [status(i) for i in (a, b, c)] == ["pending", "blocked", "blocked"]
    drain()
    assert [p for _, p in runs()] == ["a", "b", "c"]


def _id_made_at(seconds: float) -> str:
    """An id of the form ids.new_id writes, made at ``seconds``."""
    h = f"{(int(seconds * 1000) << 80) | (0x7 << 76) | (0b10 << 62) | 12345:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


@pytest.mark.parametrize(
    "unknown, why",
    [
        ("not-a-job", "not an id this queue makes"),
        (str(uuid.uuid4()), "not an id this queue makes"),
        ("01A249BC-0B94-70BD-8F8C-5945C0C261ED", "not an id this queue makes"),  # not as it writes them
        (_id_made_at(time.time() + 86400), "carries a time later than now"),
    ],
)
def test_after_refuses_an_id_that_names_nothing(unknown, why):
    """A typo, an id of another database: refused, not taken for a success; the caller's
    transaction goes on, and enqueue_many names the item."""
    a = rws.enqueue("test.record", "a")
    with transaction.atomic():
        with pytest.raises(ValueError, match=f"after names '{unknown}', which is no job or batch.*{why}"):
            rws.enqueue("test.record", "x", after=[a, unknown])
        with pytest.raises(ValueError, match=f"job #1: after names '{unknown}'"):
            rws.enqueue_many(["test.record", {"job_type": "test.record", "after": [unknown]}])
        assert rws.enqueue("test.record", "y", after=[a])  # the transaction is still usable
    assert Job.objects.count() == 2 and Dependency.objects.count() == 1
    # A job made before the enqueue and gone has succeeded (and was deleted).
    assert status(rws.enqueue("test.record", "z", after=[_id_made_at(time.time() - 5)])) == "pending"


def test_after_takes_a_batch_id_given_as_text(runs):
    """``b.id`` (what a view or a job passes on) is the batch, as ``b`` is."""
    with rws.batch() as b:
        b.enqueue("test.record", "m1")
        with pytest.raises(ValueError, match="cannot wait for it"):
            rws.enqueue("test.record", "x", after=[b.id])
    job = rws.enqueue("test.record", "report", after=[b.id], priority=100)
    assert status(job) == "blocked"
    assert Dependency.objects.get(job_id=job).on_batch
    drain()
    assert [p for _, p in runs()] == ["m1", "report"]


def test_the_rows_of_jobs_that_are_gone_are_pruned(monkeypatch):
    """A chain's and an after='s rows go once their waiting jobs are gone, in bounded passes from
    where the last one stopped (the keeper's, each recovery interval); those of jobs still there
    (blocked, dead: it may be retried) stay."""
    from types import SimpleNamespace

    from django_rws_jobs.worker.keeper import LeaseKeeper

    for n in range(3):
        rws.chain(
            rws.call("test.record", f"{n}a"), rws.call("test.record", f"{n}b"), rws.call("test.record", "c")
        )
    dead = rws.enqueue("test.fail", "x", max_retries=0)
    after_dead = rws.enqueue("test.record", "y", after=[dead], on_dependency_failure="wait")
    drain()
    (dead_too,) = rws.chain(rws.call("test.record", "z"), rws.call("test.fail", "w", max_retries=0))[1:]
    drain()
    assert status(dead_too) == "failed" and Dependency.objects.count() == 3 * 2 + 2
    store = Store(connections["default"])
    monkeypatch.setattr(dependency_outcomes, "PRUNE_JOBS", 2)
    keeper = SimpleNamespace(shared=SimpleNamespace(alias="default"), prune_edges_after="")
    passes = 0
    while True:
        LeaseKeeper._tidy(keeper, store)  # type: ignore[arg-type]
        passes += 1
        if not keeper.prune_edges_after:
            break
    assert passes == 5  # 8 waiting jobs, 2 a pass, and a last one that finds none
    assert set(Dependency.objects.values_list("job_id", flat=True)) == {after_dead, dead_too}


def test_deleting_a_dependency_that_did_not_succeed_is_its_failure():
    """An operator's delete of a dead (or pending) dependency: it will never succeed nor be
    retried, so what waits for it fails; a "wait" for its retry is cancelled, not blocked for
    ever, and a retry of the waiting job does not bring the wait back. A delete that does not
    say so (the admin's, an ORM delete) is found by the sweep."""
    dead = rws.enqueue("test.fail", "x", max_retries=0)
    drain()
    waits = rws.enqueue("test.record", "w", after=[dead], on_dependency_failure="wait")
    further = rws.enqueue("test.record", "f", after=[waits])
    later = rws.enqueue("test.record", "p", run_in=3600)
    after_later = rws.enqueue("test.record", "a", after=[later])
    assert (status(waits), status(further), status(after_later)) == ("blocked", "blocked", "blocked")
    assert rws.delete(dead) and rws.delete(later)
    assert (status(waits), status(further), status(after_later)) == ("cancelled", "cancelled", "cancelled")
    assert rws.retry(waits)
    assert status(waits) == "cancelled"
    dead_too = rws.enqueue("test.fail", "y", max_retries=0)
    drain()
    waits_too = rws.enqueue("test.record", "w2", after=[dead_too], on_dependency_failure="wait")
    Job.objects.filter(id=dead_too).delete()
    assert status(waits_too) == "blocked"
    dependency_outcomes.sweep(Store(connections["default"]), 0)
    assert status(waits_too) == "cancelled"


def test_a_dependency_cycle_through_open_batches_is_refused(runs):
    """Two batches open at once (here in two contexts, as in two threads): a member of each
    waiting for the other would leave both blocked for ever. The enqueue that closes the cycle
    is refused, directly or through a job that waits for the batch; the rest runs."""
    first, second = rws.batch(), rws.batch()
    elsewhere = contextvars.copy_context()
    elsewhere.run(second.__enter__)
    with first:
        first.enqueue("test.record", "a1", after=[second])
        outside = contextvars.Context().run(lambda: rws.enqueue("test.record", "k", after=[first.id]))
        with pytest.raises(ValueError, match=f"waits .* for batch {second.id}, whose member"):
            elsewhere.run(lambda: second.enqueue("test.record", "b1", after=[first]))
        with pytest.raises(ValueError, match=f"after names {outside}, which waits"):
            first.enqueue("test.record", "a2", after=[outside])
        elsewhere.run(lambda: second.enqueue("test.record", "b2"))
    elsewhere.run(second.__exit__, None, None, None)
    drain()
    assert [p for _, p in runs()] == ["b2", "a1", "k"]
    assert Job.objects.count() == 0


def test_a_retried_member_cancelled_again_finishes_its_batch_again():
    """A member that waits for a dead job, retried while that job is still dead, is cancelled
    again by the retry's recheck, which records it in its batch: the batch finishes again."""
    dead = rws.enqueue("test.fail", "x", max_retries=0)
    with rws.batch() as b:
        member = b.enqueue("test.record", "m", after=[dead])
    drain()
    assert status(member) == "cancelled" and rws.get_batch(b.id).state == "finished"
    assert rws.retry(member)
    assert status(member) == "cancelled"
    batch = rws.get_batch(b.id)
    assert (batch.state, batch.outcome, batch.cancelled) == ("finished", "failed", 1)


def test_an_end_nobody_recorded_is_found_by_the_recheck_and_the_sweep():
    a1 = rws.enqueue("test.record", "a1")
    a2 = rws.enqueue("test.record", "a2")
    b = rws.enqueue("test.record", "b", after=[a1])
    c = rws.enqueue("test.record", "c", after=[a2])
    Job.objects.filter(id__in=[a1, a2]).delete()  # they succeeded; the worker died before resolving
    dependency_outcomes.recheck("default", [b])
    assert (status(b), status(c)) == ("pending", "blocked")
    assert dependency_outcomes.sweep(Store(connections["default"]), 0) >= 1
    assert status(c) == "pending"


def test_enqueue_many_items_take_after():
    a = rws.enqueue("test.record", "a")
    ids = rws.enqueue_many(
        [
            {"job_type": "test.record", "after": [a]},
            {"job_type": "test.record", "payload": "free"},
            {"job_type": "test.record", "after": [a], "on_dependency_failure": "run"},
        ]
    )
    assert [status(i) for i in ids] == ["blocked", "pending", "blocked"]
    assert Dependency.objects.filter(depends_on=a).count() == 2


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"after": "01000000-0000-7000-8000-000000000000"}, "put a single id in a list"),
        ({"after": []}, "at least one job or batch"),
        ({"after": [42]}, "after takes job ids (str) and batches, got int"),
        ({"after": ["a"], "on_dependency_failure": "retry"}, "must be one of cancel, run, wait"),
        ({"on_dependency_failure": "run"}, "needs after="),
        ({"on_dependency_failure": "later"}, "must be one of cancel, run, wait"),
    ],
)
def test_bad_input_is_a_clear_error_and_stores_nothing(kwargs, error):
    with pytest.raises((TypeError, ValueError)) as caught:
        rws.enqueue("test.record", "x", **kwargs)
    assert error in str(caught.value)
    assert Job.objects.count() == 0 and Dependency.objects.count() == 0


def test_after_takes_more_ids_than_one_statement_holds():
    """14,000 edges of 5 values each: one INSERT would pass the 32,766 parameters of SQLite's
    default build (Debian's takes 250,000: set here to the default's) and the 65,535 of
    PostgreSQL's protocol where parameters are bound on the server."""
    connection.ensure_connection()
    raw = connection.connection
    limit = getattr(raw, "setlimit", None) if connection.vendor == "sqlite" else None
    before = limit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 32_766) if limit else None
    try:
        ids = rws.enqueue_many(["test.record"] * 14_000)
        waiting = rws.enqueue("test.record", "x", after=ids)
    finally:
        if limit:
            limit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, before)
    assert status(waiting) == "blocked"
    assert Dependency.objects.filter(job_id=waiting, outcome__isnull=True).count() == 14_000
    assert Job.objects.filter(id__in=ids[-500:], has_dependents=True).count() == 500


def test_a_unique_job_already_live_gets_no_dependencies():
    held = rws.enqueue("test.record", "u", unique="k")
    other = rws.enqueue("test.record", "o")
    assert rws.enqueue("test.record", "u", unique="k", after=[other]) == held
    assert status(held) == "pending" and Dependency.objects.count() == 0


def test_a_member_cannot_wait_for_its_own_batch():
    with rws.batch() as b:
        with pytest.raises(ValueError, match="cannot wait for it"):
            rws.enqueue("test.record", "x", after=[b])
        with pytest.raises(ValueError, match="cannot wait for it"):
            rws.enqueue_many([{"job_type": "test.record", "after": [b]}])
    assert Job.objects.count() == 0 and rws.get_batch(b.id).state == "finished"


def test_chain_runs_steps_in_order_with_groups_side_by_side(runs):
    from tests.testapp.tasks import whoami

    ids = rws.chain(
        rws.call("test.record", "a", priority=-5),
        [rws.call("test.record", "b"), rws.call("test.record", "c", queue="other")],
        rws.call(whoami),
    )
    assert len(ids) == 4 and [status(i) for i in ids] == ["pending", "blocked", "blocked", "blocked"]
    assert {d.depends_on for d in Dependency.objects.filter(job_id=ids[3])} == {ids[1], ids[2]}
    assert drain() == 4
    order = [p for _, p in runs() if _ == "record"]
    assert order[0] == "a" and sorted(order[1:3]) == ["b", "c"]
    assert Job.objects.count() == 0


def test_a_chain_step_that_dies_cancels_the_rest():
    ids = rws.chain(
        rws.call("test.fail", "x", max_retries=0), rws.call("test.record", "b"), rws.call("test.record", "c")
    )
    drain()
    assert [status(i) for i in ids] == ["failed", "cancelled", "cancelled"]


@pytest.mark.parametrize(
    ("steps", "kwargs", "error"),
    [
        ((), {}, "needs at least one step"),
        (("test.record",), {}, "step 1 must be a call"),
        ((None,), {}, "step 1 must be a call"),
        (("CALL", []), {}, "step 2 must be a call"),
        (("CALL",), {"on_dependency_failure": "skip"}, "skip"),
    ],
)
def test_chain_bad_input_is_a_clear_error_and_stores_nothing(steps, kwargs, error):
    steps = tuple(rws.call("test.record", "a") if s == "CALL" else s for s in steps)
    with pytest.raises((TypeError, ValueError), match=error):
        rws.chain(*steps, **kwargs)
    assert Job.objects.count() == 0
