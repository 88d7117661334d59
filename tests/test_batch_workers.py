"""Batches through real worker processes: callbacks once per finish while workers are killed, and
a batch of 100,000 members built from a generator in bounded memory."""

import json
import random
import signal
import time
from collections import defaultdict

import pytest

import django_rws_jobs as rws
from django_rws_jobs.models import BatchMember, BatchRecord, Job
from tests.conftest import run_python
from tests.test_worker import wait_for, workers  # noqa: F401  (the fixture)
from tests.testapp.models import Run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

FAST = {"LEASE_SECONDS": 2, "RECOVERY_INTERVAL": 0.5, "BACKOFF_INITIAL": 0.1}


def fired() -> dict:
    """(batch, event) -> the ids of the callback jobs that ran for it."""
    seen = defaultdict(set)
    for r in Run.objects.filter(kind="callback"):
        c = json.loads(r.payload)
        seen[(c["batch"], c["event"])].add(c["job"])
    return seen


def test_callbacks_fire_once_per_batch_while_workers_are_killed(workers):  # noqa: F811
    """10 batches of 60 members on 3 worker processes, one of them killed with SIGKILL every
    second for 12 s (and started again): each batch's two callbacks are enqueued once, and a
    lease later no second one has appeared."""
    batches = []
    for _ in range(10):
        with rws.batch(
            on_success=rws.call("test.batch_callback", "ok"), on_finish=rws.call("test.batch_callback", "end")
        ) as batch:
            batch.enqueue_many([("test.sleep", "0.2") for _ in range(60)])  # 10 s of work on 12 threads
        batches.append(batch.id)
    live = [workers("--workers", "4", jobs=FAST) for _ in range(3)]
    rng = random.Random(7)
    for _ in range(12):
        time.sleep(1)
        victim = live.pop(rng.randrange(len(live)))
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait()
        live.append(workers("--workers", "4", jobs=FAST))
    wait_for(
        lambda: BatchRecord.objects.filter(state="finished").count() == 10 and len(fired()) == 20,
        timeout=120,
        what="every batch to finish and its callbacks to run",
    )
    time.sleep(FAST["LEASE_SECONDS"] + 2)  # a lease more: recovery and sweeps have had their turn
    seen = fired()
    assert sorted(seen) == sorted((b, e) for b in batches for e in ("success", "finish"))
    assert all(len(job_ids) == 1 for job_ids in seen.values()), seen
    assert Job.objects.filter(batch_event__isnull=False).count() == 0  # each ran, none is left
    assert set(BatchRecord.objects.values_list("outcome", flat=True)) == {"succeeded"}
    assert BatchMember.objects.count() == 0
    assert Run.objects.filter(kind="start").count() > 600  # the kills hit members in flight: re-runs
    for w in live:
        w.signal(signal.SIGTERM)
        assert w.wait(30) == 0, w.output()[-3000:]


def test_a_batch_whose_finish_fails_never_stops_a_worker_nor_its_sweeps(workers):  # noqa: F811
    """A batch whose stored callbacks the database refuses (raw SQL: the API refuses them) fails
    at the worker's finish and at every sweep: each time a logged error. The worker keeps
    running, the other batch finishes, the rest of each sweep runs (a dependency's unrecorded
    death releases its waiter, an old batch is pruned)."""
    from tests.test_batches import spoil_callbacks

    with rws.batch(on_success=rws.call("test.record", "bad callback")) as bad:
        bad.enqueue("test.record", "bad member")
    spoil_callbacks(bad.id)
    with rws.batch(on_success=rws.call("test.record", "good callback")) as good:
        good.enqueue("test.record", "good member")
    with rws.batch() as old:
        pass
    BatchRecord.objects.filter(id=old.id).update(finished_at=1)  # long past its retention
    dead = rws.enqueue("test.record", "dead", run_in=3600)
    rws.enqueue("test.record", "waiter", after=[dead], on_dependency_failure="run")
    Job.objects.filter(id=dead).update(status="failed")  # a death nobody recorded: the sweep's

    def ran(payload: str) -> bool:
        return Run.objects.filter(kind="record", payload=payload).exists()

    w = workers("--workers", "2", jobs=FAST)
    wait_for(
        lambda: ran("good callback") and ran("waiter") and not BatchRecord.objects.filter(id=old.id).exists(),
        timeout=60,
        what=f"the good batch, the waiter and the pruning:\n{w.output()[-3000:]}",
    )
    wait_for(lambda: w.output().count(f"batch {bad.id}: its finish failed") >= 3, timeout=30)
    assert w.proc.poll() is None, w.output()[-3000:]
    assert BatchRecord.objects.get(id=bad.id).state == "sealed" and not ran("bad callback")
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0, w.output()[-3000:]


def test_a_batch_of_100000_members_from_a_generator_stays_in_bounded_memory():
    """The enqueuing process's Python allocations peak under 64 MiB while 100,000 members go in
    from a generator, and the batch counts them all; a member that ran while the block was open
    did not finish it."""
    child = run_python(
        """
import json, tracemalloc
import django_rws_jobs as rws
tracemalloc.start()
with rws.batch(on_finish=rws.call("test.batch_callback", "end")) as b:
    b.enqueue_many(("test.batch_member", str(i)) for i in range(100_000))
    rws.tick()  # one member runs while the block is open
    state = rws.get_batch(b.id).state
current, peak = tracemalloc.get_traced_memory()
print(json.dumps({"id": b.id, "peak": peak, "state": state}))
""",
        timeout=600,
    )
    out, _ = child.communicate(timeout=600)
    assert child.returncode == 0, out
    result = json.loads(out.strip().splitlines()[-1])
    assert result["state"] == "open"
    assert result["peak"] < 64 * 2**20, f"peak {result['peak'] / 2**20:.1f} MiB"
    got = rws.get_batch(result["id"])
    assert (got.state, got.total, got.succeeded, got.pending) == ("sealed", 100_000, 1, 99_999)


def test_a_chain_a_diamond_and_a_late_dependent_run_through_a_worker_without_polling(workers):  # noqa: F811
    """The worker that ends a job releases what waits for it and wakes its own dispatcher: with a
    30 s poll interval and no sweep, a chain of 20 finishes in seconds. A job enqueued after a
    job that is already running is released by that job's deletion (its has_dependents)."""
    previous = rws.enqueue("test.record", "chain 0")
    for i in range(1, 20):
        previous = rws.enqueue("test.record", f"chain {i}", after=[previous])
    top = rws.enqueue("test.record", "top")
    left = rws.enqueue("test.record", "left", after=[top])
    right = rws.enqueue("test.record", "right", after=[top])
    rws.enqueue("test.record", "join", after=[left, right])
    rws.enqueue("test.enqueue_after_me", "late")
    w = workers("--workers", "4", jobs={"POLL_INTERVAL": 30, "RECOVERY_INTERVAL": 3600})
    wait_for(lambda: Job.objects.count() == 0, timeout=60, what="the chain, the diamond and the late job")
    order = [r.payload for r in Run.objects.filter(kind="record").order_by("id")]
    chain = [p for p in order if p.startswith("chain")]
    assert chain == [f"chain {i}" for i in range(20)]
    diamond = [p for p in order if p in ("top", "left", "right", "join")]
    assert diamond[0] == "top" and diamond[-1] == "join"
    assert "late" in order
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0, w.output()[-3000:]


@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_members_keep_outputs_from_worker_threads_and_child_processes(workers, pool):  # noqa: F811
    """current_job().record() in a real worker, its handlers in threads or in child processes:
    every member's output (a retried one's from its second attempt) comes back in order."""
    asks = [{"value": i} for i in range(20)] + [{"value": "r", "per_attempt": True, "fail_first": True}]
    with rws.batch() as b:
        ids = b.enqueue_many([("test.batch_output", json.dumps(ask)) for ask in asks])
    w = workers("--workers", "2", "--pool", pool, jobs=FAST)
    wait_for(lambda: rws.get_batch(b.id).state == "finished", timeout=60, what="the batch to finish")
    assert list(rws.get_batch(b.id).outputs()) == [*zip(ids, [*range(20), "r@2"], strict=True)]
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0, w.output()[-3000:]


def test_a_burst_worker_runs_a_whole_chain(workers):  # noqa: F811
    """``rws_worker --burst`` over a chain of 30 jobs runs all 30 in order before it exits: it
    does not take the moment between a job's end and its dependent's release for an empty queue."""
    previous = rws.enqueue("test.record", "0")
    for i in range(1, 30):
        previous = rws.enqueue("test.record", str(i), after=[previous])
    w = workers("--workers", "1", "--burst")
    assert w.wait(60) == 0, w.output()[-3000:]
    ran = [r.payload for r in Run.objects.filter(kind="record").order_by("id")]
    assert ran == [str(i) for i in range(30)]


def test_a_chain_of_keyed_jobs_runs_without_polling(workers):  # noqa: F811
    """Ten jobs, each after the one before and all with one concurrency key, on a worker whose
    poll interval is 30 s: each released job is promoted and claimed at once, not at a poll or
    a later sweep of the keys."""
    previous = rws.enqueue("test.record", "0", concurrency_key="k")
    for i in range(1, 10):
        previous = rws.enqueue("test.record", str(i), after=[previous], concurrency_key="k")
    w = workers("--workers", "1", jobs={"POLL_INTERVAL": 30})
    w.started()
    t0 = time.monotonic()
    wait_for(lambda: Run.objects.filter(kind="record").count() == 10, timeout=60, what="the chain to run")
    assert time.monotonic() - t0 < 5, "a step waited for a poll or a sweep of the keys"
    ran = [r.payload for r in Run.objects.filter(kind="record").order_by("id")]
    assert ran == [str(i) for i in range(10)]
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0, w.output()[-3000:]


def test_cascade_and_fail_fast_cancels_finish_their_batches_without_a_sweep(workers):  # noqa: F811
    """Through a worker whose sweeps are an hour apart: a member cancelled because the member it
    waits for died, and a blocked member cancelled by fail_fast, are recorded at once, so both
    batches finish and fire on_failure."""
    with rws.batch(on_failure=rws.call("test.batch_callback", "cascade")) as chained:
        dies = chained.enqueue("test.batch_member", "fail", max_retries=0)
        chained.enqueue("test.batch_member", "1", after=[dies])
    with rws.batch(on_failure=rws.call("test.batch_callback", "fail_fast"), fail_fast=True) as fast:
        fast.enqueue("test.batch_member", "fail", max_retries=0, priority=10)
        later = fast.enqueue("test.batch_member", "2", run_in=3600)
        fast.enqueue("test.batch_member", "3", after=[later])
    w = workers(jobs={**FAST, "RECOVERY_INTERVAL": 3600})
    wait_for(
        lambda: {(b, e) for b, e in fired()} == {(chained.id, "failure"), (fast.id, "failure")},
        timeout=30,
        what="both batches to fire on_failure",
    )
    assert rws.get_batch(chained.id).cancelled == 1 and rws.get_batch(fast.id).cancelled == 2
    assert not Job.objects.filter(status="blocked").exists()
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0, w.output()[-3000:]
