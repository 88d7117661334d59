"""Batches: members, the finish, callbacks once per finish, fail_fast, cancel, retry, the sweep.

In-process (``tick()``) here; tests/test_batch_workers.py runs them through worker processes.
"""

import json
import logging
import threading

import pytest
from django.db import connection, connections, transaction
from django.test import override_settings

import django_rws_jobs as rws
from django_rws_jobs.api.batches import BatchClosed
from django_rws_jobs.database.backends.claimed import Claimed
from django_rws_jobs.models import BatchMember, BatchOutput, BatchRecord, Job
from django_rws_jobs.queue.store import Store
from django_rws_jobs.running.context import output_text
from django_rws_jobs.workflows import batch_outcomes, batch_upkeep, outputs
from tests.conftest import drain
from tests.testapp.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


def callbacks() -> list[dict]:
    return [json.loads(r.payload) for r in Run.objects.filter(kind="callback").order_by("id")]


def counts(batch_id: str) -> tuple:
    b = rws.get_batch(batch_id)
    return (b.state, b.outcome, b.total, b.succeeded, b.failed, b.cancelled, b.pending)


def cb(name: str):
    return rws.call("test.batch_callback", name)


def test_a_batch_whose_members_succeed_fires_on_success_and_on_finish_once():
    with rws.batch(on_success=cb("ok"), on_failure=cb("bad"), on_finish=cb("end"), description="d") as b:
        member_ids = [b.enqueue("test.batch_member", str(i)) for i in range(3)]
        rws.enqueue("test.batch_member", "plain")  # a plain enqueue in the block joins too
        b.enqueue_many([("test.batch_member", "m1"), {"job_type": "test.batch_member", "payload": "m2"}])
    assert counts(b.id) == ("sealed", None, 6, 0, 0, 0, 6)
    assert set(Job.objects.filter(id__in=member_ids).values_list("batch_id", flat=True)) == {b.id}
    assert drain() == 8  # six members, then two callbacks
    assert {json.loads(r.payload)["batch"] for r in Run.objects.filter(kind="member")} == {b.id}
    fired = callbacks()
    assert sorted((c["payload"], c["event"]) for c in fired) == [("end", "finish"), ("ok", "success")]
    assert all(c["batch"] == b.id and c["state"] == "finished" for c in fired)
    assert fired[0]["counts"] == [6, 6, 0, 0, 0]
    assert counts(b.id) == ("finished", "succeeded", 6, 6, 0, 0, 0)
    assert BatchMember.objects.count() == 0 and Job.objects.count() == 0


def test_members_that_run_while_the_block_is_open_cannot_finish_it():
    with rws.batch(on_finish=cb("end")) as b:
        b.enqueue("test.batch_member", "early")
        assert drain() == 1  # the member ran and succeeded inside the block
        assert counts(b.id) == ("open", None, 1, 1, 0, 0, 0)
        assert callbacks() == []
        b.enqueue("test.batch_member", "late")
    assert drain() == 2  # the late member, then the callback
    assert [c["payload"] for c in callbacks()] == ["end"]


def test_an_empty_batch_finishes_when_its_block_ends():
    with rws.batch(on_success=cb("ok")) as b:
        pass
    assert counts(b.id) == ("finished", "succeeded", 0, 0, 0, 0, 0)
    assert drain() == 1 and [c["event"] for c in callbacks()] == ["success"]


def test_a_dead_member_fires_on_failure_and_retry_failed_then_fires_on_success_once():
    with rws.batch(on_success=cb("ok"), on_failure=cb("bad")) as b:
        b.enqueue("test.batch_member", "fine")
        dead = b.enqueue("test.batch_member", "fail", max_retries=0)
    drain()
    assert counts(b.id) == ("finished", "failed", 2, 1, 1, 0, 0)
    assert [c["payload"] for c in callbacks()] == ["bad"]
    assert [j.id for j in rws.get_batch(b.id).failed_jobs()] == [dead]
    Job.objects.filter(id=dead).update(payload="fixed")  # the bug is fixed; retry the dead
    assert rws.get_batch(b.id).retry_failed() == 1
    assert counts(b.id) == ("sealed", None, 2, 1, 0, 0, 1)
    drain()
    assert [c["payload"] for c in callbacks()] == ["bad", "ok"]
    assert counts(b.id) == ("finished", "succeeded", 2, 2, 0, 0, 0)
    assert BatchRecord.objects.get(id=b.id).generation == 1


def test_retrying_one_dead_member_reopens_its_batch():
    with rws.batch(on_success=cb("ok"), on_failure=cb("bad")) as b:
        dead = b.enqueue("test.batch_member", "fail", max_retries=0)
    drain()
    Job.objects.filter(id=dead).update(payload="fixed")
    assert rws.retry(dead)
    assert counts(b.id)[:2] == ("sealed", None)
    drain()
    assert [c["payload"] for c in callbacks()] == ["bad", "ok"]


def test_an_exception_in_the_block_cancels_the_batch_and_its_members():
    with pytest.raises(ZeroDivisionError):
        with rws.batch(on_finish=cb("end"), on_failure=cb("bad")) as b:
            member = b.enqueue("test.batch_member", "1")
            raise ZeroDivisionError("in the block")
    assert counts(b.id) == ("cancelled", None, 1, 0, 0, 1, 0)
    assert Job.objects.get(id=member).status == "cancelled"
    assert drain() == 0 and callbacks() == []
    with pytest.raises(BatchClosed, match="inside its with block"):
        b.enqueue("test.batch_member", "after")


def test_a_batch_inside_a_transaction_commits_and_rolls_back_with_it():
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            with rws.batch(on_finish=cb("end")) as b:
                b.enqueue("test.batch_member", "1")
            raise RuntimeError("the caller rolls back")
    assert rws.get_batch(b.id) is None and Job.objects.count() == 0 and BatchMember.objects.count() == 0
    with transaction.atomic():
        with rws.batch(on_finish=cb("end")) as b:
            pass
        assert callbacks() == [] and Job.objects.count() == 0  # the finish waits for the commit
    assert drain() == 1 and [c["payload"] for c in callbacks()] == ["end"]


def test_fail_fast_cancels_the_rest_when_a_member_dies():
    with rws.batch(on_failure=cb("bad"), on_success=cb("ok"), fail_fast=True) as b:
        b.enqueue("test.batch_member", "fail", max_retries=0, priority=10)  # runs first
        rest = [b.enqueue("test.batch_member", str(i)) for i in range(5)]
    drain()
    assert counts(b.id) == ("finished", "failed", 6, 0, 1, 5, 0)
    assert set(Job.objects.filter(id__in=rest).values_list("status", flat=True)) == {"cancelled"}
    assert [c["payload"] for c in callbacks()] == ["bad"]
    assert Run.objects.filter(kind="member").count() == 1


def test_cancel_stops_a_sealed_batch_and_fires_nothing():
    with rws.batch(on_finish=cb("end")) as b:
        b.enqueue("test.batch_member", "1")
        b.enqueue("test.batch_member", "2")
    assert rws.get_batch(b.id).cancel(by="ops")
    assert not rws.get_batch(b.id).cancel()  # once
    assert counts(b.id) == ("cancelled", None, 2, 0, 0, 2, 0)
    assert drain() == 0 and callbacks() == []
    assert set(Job.objects.values_list("cancelled_by", flat=True)) == {"ops"}


def test_cancelling_one_member_counts_it_and_fails_the_batch():
    with rws.batch(on_failure=cb("bad"), on_success=cb("ok")) as b:
        one = b.enqueue("test.batch_member", "1")
        b.enqueue("test.batch_member", "2")
    assert rws.cancel(one)
    drain()
    assert counts(b.id) == ("finished", "failed", 2, 1, 0, 1, 0)
    assert [c["payload"] for c in callbacks()] == ["bad"]


def test_callbacks_keep_their_options_and_a_task_can_be_one():
    from tests.testapp.tasks import whoami

    with rws.batch(
        on_finish=[
            rws.call("test.batch_callback", "slow", queue="reports", priority=3, run_in=3600),
            rws.call(whoami),
        ]
    ) as b:
        pass
    fired = Job.objects.filter(batch_id=b.id).order_by("job_type")
    assert [(j.job_type.split(":")[0], j.batch_event) for j in fired] == [
        ("django.tasks", "finish"),
        ("test.batch_callback", "finish"),
    ]
    slow = fired.get(job_type="test.batch_callback")
    assert (slow.queue, slow.priority, slow.payload) == ("reports", 3, "slow")
    assert 3600 <= slow.next_run_at - slow.created_at <= 3601  # (due times round up to the second)


def test_a_bad_item_in_b_enqueue_many_stores_nothing_of_the_call():
    with pytest.raises(TypeError, match=r"job #5: "):
        with rws.batch() as b:
            b.enqueue("test.batch_member", "before")
            b.enqueue_many(iter([("test.batch_member", str(i)) for i in range(5)] + [42]), batch_size=2)
    # The call's rows rolled back; the member before it was cancelled with the batch.
    assert counts(b.id) == ("cancelled", None, 1, 0, 0, 1, 0)
    assert Job.objects.count() == 1


def test_a_unique_job_already_live_is_not_made_a_member():
    held = rws.enqueue("test.batch_member", "u", unique="k")
    with rws.batch() as b:
        assert b.enqueue("test.batch_member", "u", unique="k") == held
        ids = rws.enqueue_many([{"job_type": "test.batch_member", "unique": "k"}, "test.batch_member"])
    assert ids[0] == held
    assert counts(b.id)[2] == 1
    assert Job.objects.get(id=held).batch_id is None


@pytest.mark.parametrize(
    "make, error",
    [
        (lambda: rws.call(""), "job_type must not be empty"),
        (lambda: rws.call(42), "call() takes a job_type"),
        (lambda: rws.call("t", "a", "b"), "takes one payload"),
        (lambda: rws.call("t", unique="k"), "takes no 'unique'"),
        (lambda: rws.call("t", colour="red"), "colour"),
        (lambda: rws.batch(on_success="reports.build"), "on_success must be a call"),
        (lambda: rws.batch(on_finish=[]), "on_finish must be a call"),
        (lambda: rws.batch(metadata=["a"]), "metadata must be a dict"),
        (lambda: rws.batch(metadata={"a": object()}), "metadata must be JSON"),
        (lambda: rws.batch(metadata={"a": "x" * 70000}), "the limit is 65536"),
        (lambda: rws.batch(fail_fast="yes"), "fail_fast must be True or False"),
    ],
)
def test_bad_input_is_a_clear_error_and_stores_nothing(make, error):
    with pytest.raises((TypeError, ValueError)) as caught:
        make()
    assert error in str(caught.value)
    assert BatchRecord.objects.count() == 0 and Job.objects.count() == 0


def test_batches_do_not_nest():
    with rws.batch() as outer:
        with pytest.raises(RuntimeError, match="do not nest"):
            with rws.batch():
                pass
    assert counts(outer.id)[0] == "finished"


@pytest.mark.skipif("other" not in connections.settings, reason="needs a second database")
def test_a_job_for_another_database_inside_a_batch_is_refused():
    with rws.batch() as b:
        with pytest.raises(ValueError, match="a batch's members are on its own database"):
            rws.enqueue("test.batch_member", "x", using="other")
    assert counts(b.id)[2] == 0


def test_two_writers_that_both_see_nothing_outstanding_finish_once():
    """The interleaving the finish must survive: the last two members end at once, both writers
    probe (nothing outstanding) before either writes; one compare-and-set wins."""
    with rws.batch(on_finish=cb("end"), on_success=cb("ok")) as b:
        b.enqueue("test.batch_member", "1")
        b.enqueue("test.batch_member", "2")
    BatchMember.objects.filter(batch_id=b.id).delete()  # both members' outcomes committed
    Job.objects.filter(batch_id=b.id).delete()
    both_probed = threading.Barrier(2, timeout=30)
    won: list[bool] = []

    def finish() -> None:
        try:
            won.append(
                batch_outcomes.try_finish(
                    Store(connections["default"]), b.id, 0, before_finish=both_probed.wait
                )
            )
        finally:
            connections.close_all()

    threads = [threading.Thread(target=finish) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(won) == [False, True]
    assert Job.objects.filter(batch_id=b.id).count() == 2  # on_finish and on_success, once each


def test_the_sweep_finishes_what_a_crash_left():
    """A worker killed between a member's outcome and its member row leaves the member
    outstanding; the sweep reads the job rows and finishes the batch once."""
    with rws.batch(on_finish=cb("end"), on_failure=cb("bad")) as b:
        ok = b.enqueue("test.batch_member", "ok")
        dead = b.enqueue("test.batch_member", "dead")
    Job.objects.filter(id=ok).delete()  # it succeeded; its member row was not written
    Job.objects.filter(id=dead).update(status="failed")  # it died; likewise
    store = Store(connections["default"])
    assert batch_upkeep.sweep(store, 100) == 1
    assert batch_upkeep.sweep(store, 100) == 0
    assert counts(b.id) == ("finished", "failed", 2, 1, 1, 0, 0)
    assert sorted(
        Job.objects.filter(batch_id=b.id, batch_event__isnull=False).values_list("batch_event", flat=True)
    ) == [
        "failure",
        "finish",
    ]


def spoil_callbacks(batch_id: str) -> None:
    """Give the batch stored callbacks whose INSERT every database refuses (a job_type of NULL),
    by raw SQL: the API refuses such values, but a row may come from elsewhere."""
    stored = json.loads(BatchRecord.objects.get(id=batch_id).callbacks)
    for rows in stored.values():
        for row in rows:
            row[1] = None
    with connection.cursor() as c:
        c.execute("UPDATE rws_batches SET callbacks = %s WHERE id = %s", [json.dumps(stored), batch_id])


def test_a_batch_whose_finish_fails_is_skipped_and_the_sweep_goes_on(caplog):
    """A batch whose finish the database refuses is logged and skipped: the sweep still
    finishes the other batches, and what waits for them is released."""
    with rws.batch(on_success=cb("bad")) as bad:
        bad_member = bad.enqueue("test.batch_member", "1")
    with rws.batch(on_success=cb("good")) as good:
        good_member = good.enqueue("test.batch_member", "2")
    spoil_callbacks(bad.id)
    waiting = rws.enqueue("test.record", "after good", after=[good])
    Job.objects.filter(id__in=[bad_member, good_member]).delete()  # they succeeded, unrecorded
    store = Store(connections["default"])
    with caplog.at_level(logging.ERROR, logger="django_rws_jobs"):
        assert batch_upkeep.sweep(store, 100) == 1
    assert f"batch {bad.id}: its finish failed; skipped until the next sweep" in caplog.text
    assert counts(good.id) == ("finished", "succeeded", 1, 1, 0, 0, 0)
    assert counts(bad.id)[:2] == ("sealed", None)  # its transaction rolled back: tried again later
    assert list(Job.objects.filter(batch_event__isnull=False).values_list("batch_id", flat=True)) == [good.id]
    assert Job.objects.get(id=waiting).status == "pending"
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="django_rws_jobs"):
        assert batch_upkeep.sweep(store, 100) == 0
    assert f"batch {bad.id}: its finish failed" in caplog.text


def test_settling_twice_changes_nothing():
    with rws.batch(on_finish=cb("end")) as b:
        b.enqueue("test.batch_member", "1")
        b.enqueue("test.batch_member", "2")
    drain()
    store = Store(connections["default"])
    member = Claimed.stand_in("no-such-job", b.id)
    assert batch_outcomes.settle(store, [(member, "done"), (member, "dead")], 0) == 0
    assert counts(b.id) == ("finished", "succeeded", 2, 2, 0, 0, 0)
    assert len(callbacks()) == 1


def test_finished_batches_are_pruned_after_their_retention():
    with rws.batch() as b:
        b.enqueue("test.batch_member", "fail", max_retries=0)
    drain()
    store = Store(connections["default"])
    finished_at = BatchRecord.objects.get(id=b.id).finished_at
    assert batch_upkeep.prune(store, finished_at + 10, 60) == 0
    assert batch_upkeep.prune(store, finished_at + 61, 60) == 1
    assert rws.get_batch(b.id) is None and BatchMember.objects.count() == 0
    assert Job.objects.filter(status="failed").count() == 1  # the dead member stays in the list


def test_current_job_outside_a_batch_has_no_batch():
    rws.enqueue("test.whoami", "x")
    drain()
    assert rws.current_job() is None


@override_settings(RWS_JOBS={"METADATA_MAX_BYTES": 10})
def test_metadata_is_kept_within_its_setting():
    with pytest.raises(ValueError, match="the limit is 10"):
        rws.batch(metadata={"key": "a longer value"})
    with rws.batch(metadata={"k": 1}, description="import 7") as b:
        pass
    got = rws.get_batch(b.id)
    assert (got.metadata, got.description) == ({"k": 1}, "import 7")


def test_a_django_task_enqueued_in_the_block_is_a_member():
    from tests.testapp.tasks import whoami

    with rws.batch(on_finish=cb("end")) as b:
        result = whoami.enqueue()
    assert Job.objects.get(id=result.id).batch_id == b.id
    assert counts(b.id)[2] == 1
    drain()
    assert counts(b.id)[:2] == ("finished", "succeeded") and len(callbacks()) == 1


def out(**ask) -> str:
    return json.dumps(ask)


def test_record_keeps_a_members_last_output():
    """Outputs come back in the order the members were enqueued; a second record replaces the
    first, a retry's replaces the failed attempt's, and a member that kept none has none."""
    with rws.batch(on_finish=rws.call("test.batch_output", out(value="from the callback"))) as b:
        first = b.enqueue("test.batch_output", out(value={"rows": 3}))
        twice = b.enqueue("test.batch_output", out(value="second", twice=True))
        b.enqueue("test.batch_member", "keeps none")
        retried = b.enqueue("test.batch_output", out(value="try", per_attempt=True, fail_first=True))
    drain()
    Job.objects.filter(id=retried).update(next_run_at=0)  # its retry, due now
    drain()
    assert list(rws.get_batch(b.id).outputs()) == [
        (first, {"rows": 3}),
        (twice, "second"),
        (retried, "try@2"),
    ]
    kept = [json.loads(r.payload)["kept"] for r in Run.objects.filter(kind="output").order_by("id")]
    assert kept == [True, True, True, True, False]  # the last: the callback, which is no member


def test_an_async_handler_uses_every_job_context_method():
    """On its event loop an async def handler reads batch_id, batch_event, batch and metadata and
    calls record() (each runs its query in a thread of its own); arecord() and asave_metadata()
    run in the handler's thread. As a member and as the batch's callback."""
    with rws.batch(on_finish=rws.call("test.batch_async", "callback")) as b:
        member = b.enqueue("test.batch_async", "member", metadata={"n": 1})
    drain()
    seen = {t["payload"]: t for t in (json.loads(r.payload) for r in Run.objects.filter(kind="batch-async"))}
    assert seen["member"] == {
        "payload": "member",
        "batch": b.id,
        "event": None,
        "state": "sealed",
        "metadata": {"n": 1},
        "kept": True,
        "akept": True,
        "saved": True,
    }
    assert seen["callback"] == {
        "payload": "callback",
        "batch": b.id,
        "event": "finish",
        "state": "finished",
        "metadata": {},
        "kept": False,  # a callback is no member: it keeps no output
        "akept": False,
        "saved": True,
    }
    assert list(rws.get_batch(b.id).outputs()) == [(member, {"from": "member"})]


@pytest.mark.django_db(transaction=False)
def test_an_async_handler_ticked_inside_a_transaction_names_the_twins():
    """tick() inside the test's transaction: only the handler's thread sees the job's row. The
    metadata and batch_id are read before the event loop starts; record() and batch on the loop
    are a clear error, naming the async twin; the twins work, and the progress reported on the
    loop is written by asave_metadata()."""
    with rws.batch() as b:
        member = b.enqueue("test.batch_async", "inline-fail", max_retries=0)
    assert rws.tick()
    [seen] = [json.loads(r.payload) for r in Run.objects.filter(kind="batch-async")]
    assert seen["kept"].startswith("RuntimeError: current_job().record() on the event loop of an async")
    assert "use await arecord(), or a test outside a transaction" in seen["kept"]
    assert (seen["batch"], seen["event"], seen["metadata"]) == (b.id, None, {})
    assert seen["state"].startswith("RuntimeError: current_job().batch on the event loop")
    assert (seen["akept"], seen["saved"]) == (True, True)
    assert list(rws.get_batch(b.id).outputs()) == [(member, {"from": "inline-fail"})]
    assert Job.objects.get(id=member).metadata == {"async": True}
    progress = rws.get_progress(member)
    assert (progress.current, progress.total, progress.message) == (1, 2, "half")


def test_record_outside_a_batch_keeps_nothing():
    rws.enqueue("test.batch_output", out(value=1))
    drain()
    assert [json.loads(r.payload)["kept"] for r in Run.objects.filter(kind="output")] == [False]
    assert BatchOutput.objects.count() == 0


def test_record_rolls_back_with_the_handlers_transaction():
    with rws.batch() as b:
        b.enqueue("test.batch_output", out(value="gone", rollback=True))
    drain()
    assert list(rws.get_batch(b.id).outputs()) == []


def test_an_attempt_whose_claim_was_taken_keeps_no_output():
    with rws.batch() as b:
        b.enqueue("test.batch_output", out(value="stale", steal=True))
    rws.tick()
    assert [json.loads(r.payload)["kept"] for r in Run.objects.filter(kind="output")] == [False]
    assert BatchOutput.objects.count() == 0


@override_settings(RWS_JOBS={"OUTPUT_MAX_BYTES": 10})
def test_record_refuses_a_value_too_big_or_not_json_and_the_job_fails_saying_so():
    with pytest.raises(ValueError, match=r"record\(\): the value is 14 bytes of JSON; the limit is 10"):
        output_text("a long value")
    with pytest.raises(TypeError, match="record\\(\\) takes a JSON value, got"):
        output_text({1, 2})
    with pytest.raises(TypeError, match="JSON value"):
        output_text(float("nan"))
    with rws.batch() as b:
        member = b.enqueue("test.batch_output", out(value="x" * 20), max_retries=0)
    drain()
    assert "the limit is 10 (OUTPUT_MAX_BYTES)" in Job.objects.get(id=member).last_error
    assert BatchOutput.objects.count() == 0


def test_outputs_are_read_a_page_at_a_time_in_enqueue_order():
    with rws.batch() as b:
        ids = b.enqueue_many([("test.batch_output", out(value=i)) for i in range(7)])
    drain()
    assert list(outputs.read("default", b.id, page=3)) == [(job_id, i) for i, job_id in enumerate(ids)]
    assert list(outputs.read("default", b.id, page=7)) == [(job_id, i) for i, job_id in enumerate(ids)]
    pages = iter(outputs.read("default", b.id, page=3))
    assert next(pages) == (ids[0], 0)  # a generator: nothing more is read until asked
    assert list(outputs.read("default", "no-such-batch")) == []


def test_pruning_deletes_a_batchs_outputs_over_bounded_passes(monkeypatch):
    with rws.batch() as b:
        b.enqueue_many([("test.batch_output", out(value=i)) for i in range(5)])
        b.enqueue("test.batch_member", "fail", max_retries=0)
    drain()
    assert BatchOutput.objects.count() == 5
    monkeypatch.setattr(batch_upkeep, "PRUNE_ROWS", 2)
    store = Store(connections["default"])
    later = BatchRecord.objects.get(id=b.id).finished_at + 61
    passes = [batch_upkeep.prune(store, later, 60) for _ in range(4)]
    assert passes == [0, 0, 0, 1]  # 2 + 2 + (1 output and the member row), then the batch
    assert BatchOutput.objects.count() == 0 and BatchMember.objects.count() == 0
    assert rws.get_batch(b.id) is None


@pytest.mark.skipif(
    connection.vendor == "sqlite", reason="SQLite: an open write transaction holds the whole file"
)
def test_records_of_two_members_do_not_wait_for_each_other():
    """Two members' handlers record() in transactions open at once, at REPEATABLE READ (a user's
    setting on MariaDB): the second record goes in while the first transaction is still open. A
    DELETE then an INSERT took a gap lock there, so the second waited for the first (and two
    whose statements interleave deadlock)."""
    import time

    from django_rws_jobs.database.connections import private_connection

    with rws.batch() as b:
        b.enqueue("test.record", "a")
        b.enqueue("test.record", "b")
    worker = private_connection("default")
    try:
        now = int(time.time())
        first, second = sorted(Store(worker).claim("w#1", now, now + 60, None, 2), key=lambda j: j.id)
    finally:
        worker.close()

    def repeatable_read() -> None:
        with connection.cursor() as c:
            if connection.vendor == "mysql":
                c.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                c.execute("SET SESSION innodb_lock_wait_timeout = 1")
            else:
                c.execute("SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                c.execute("SET lock_timeout = '1s'")

    done: list[object] = []

    def other_handler() -> None:
        try:
            repeatable_read()
            with transaction.atomic():
                done.append(outputs.keep("default", second, '"y"'))
        except Exception as exc:  # the lock wait's timeout, before the fix
            done.append(exc)
        finally:
            connection.close()

    repeatable_read()
    try:
        with transaction.atomic():
            assert outputs.keep("default", first, '"x"')
            thread = threading.Thread(target=other_handler)
            thread.start()
            thread.join(10)
            assert done == [True]
    finally:
        connection.close()  # its session's isolation level goes with it
    assert dict(rws.get_batch(b.id).outputs()) == {first.id: "x", second.id: "y"}


@pytest.fixture
def cancelled_signals():
    """The ids job_cancelled was sent for, in order."""
    from django_rws_jobs.signals import job_cancelled

    sent: list[str] = []

    def receiver(sender, job, **kwargs):
        sent.append(job.id)

    job_cancelled.connect(receiver, weak=False)
    yield sent
    job_cancelled.disconnect(receiver)


def test_a_cancel_also_cancels_blocked_members(cancelled_signals):
    """Blocked members (after=) are cancelled with the pending ones, counted, signalled, and
    what waits for them outside the batch is resolved: nothing of it runs later."""
    with rws.batch(on_finish=cb("end")) as b:
        first = b.enqueue("test.batch_member", "1")
        blocked = b.enqueue("test.batch_member", "2", after=[first])
    outside = rws.enqueue("test.batch_member", "3", after=[blocked])
    assert rws.get_batch(b.id).cancel(by="ops")
    assert counts(b.id) == ("cancelled", None, 2, 0, 0, 2, 0)
    assert dict(Job.objects.values_list("id", "status")) == {
        first: "cancelled",
        blocked: "cancelled",
        outside: "cancelled",
    }
    assert sorted(cancelled_signals) == sorted([first, blocked, outside])
    assert drain() == 0 and callbacks() == []


def test_an_exception_in_the_block_cancels_its_blocked_members_too(cancelled_signals):
    with pytest.raises(ZeroDivisionError):
        with rws.batch(on_finish=cb("end")) as b:
            first = b.enqueue("test.batch_member", "1")
            blocked = b.enqueue("test.batch_member", "2", after=[first])
            raise ZeroDivisionError("in the block")
    assert counts(b.id) == ("cancelled", None, 2, 0, 0, 2, 0)
    assert set(Job.objects.values_list("status", flat=True)) == {"cancelled"}
    assert sorted(cancelled_signals) == sorted([first, blocked])
    assert drain() == 0


def test_fail_fast_cancels_blocked_members_and_finishes(cancelled_signals):
    with rws.batch(on_failure=cb("bad"), fail_fast=True) as b:
        b.enqueue("test.batch_member", "fail", max_retries=0, priority=10)
        other = b.enqueue("test.batch_member", "1", priority=-10, run_in=3600)
        blocked = b.enqueue("test.batch_member", "2", after=[other])
    drain()
    assert counts(b.id) == ("finished", "failed", 3, 0, 1, 2, 0)
    assert [c["payload"] for c in callbacks()] == ["bad"]
    assert sorted(cancelled_signals) == sorted([other, blocked])
    assert Job.objects.get(id=blocked).status == "cancelled"


def test_a_death_settled_after_a_retry_leaves_the_member_outstanding():
    """A retry lands between a member's death and the write of its member row (a worker's second
    commit, or the sweep's settle after its read): the stale 'dead' writes nothing, the batch
    waits for the retried member, and its success fires on_success."""
    with rws.batch(on_success=cb("ok"), on_failure=cb("bad")) as b:
        dead = b.enqueue("test.batch_member", "fail", max_retries=0)
    drain()
    assert [c["payload"] for c in callbacks()] == ["bad"]
    Job.objects.filter(id=dead).update(payload="fixed")
    assert rws.retry(dead)
    store = Store(connections["default"])
    assert batch_outcomes.settle(store, [(Claimed.stand_in(dead, None), "dead")], 100) == 0
    assert counts(b.id) == ("sealed", None, 1, 0, 0, 0, 1)
    assert BatchMember.objects.get(job_id=dead).outcome is None
    drain()
    assert [c["payload"] for c in callbacks()] == ["bad", "ok"]
    assert counts(b.id) == ("finished", "succeeded", 1, 1, 0, 0, 0)


def test_a_cancel_settled_after_a_retry_leaves_the_member_outstanding():
    with rws.batch(on_success=cb("ok"), on_failure=cb("bad")) as b:
        one = b.enqueue("test.batch_member", "1")
    assert rws.cancel(one)
    drain()
    assert rws.retry(one)
    store = Store(connections["default"])
    batch_outcomes.settle(store, [(Claimed.stand_in(one, None), "cancelled")], 100)
    assert counts(b.id) == ("sealed", None, 1, 0, 0, 0, 1)
    drain()
    assert [c["payload"] for c in callbacks()] == ["bad", "ok"]


def test_a_member_cancelled_by_its_dependency_finishes_its_batch_and_signals(cancelled_signals):
    """The dependency cascade records what it cancels in their batches at once (no sweep) and
    sends job_cancelled: when the dependency dies, and when a member waits for one dead already."""
    dead = rws.enqueue("test.batch_member", "fail", max_retries=0)
    with rws.batch(on_failure=cb("bad"), on_finish=cb("end")) as b:
        waits = b.enqueue("test.batch_member", "1", after=[dead])
        b.enqueue("test.batch_member", "2")
    drain()
    assert counts(b.id) == ("finished", "failed", 2, 1, 0, 1, 0)
    assert sorted(c["payload"] for c in callbacks()) == ["bad", "end"]
    assert cancelled_signals == [waits]
    with rws.batch(on_failure=cb("bad2")) as late:
        too_late = late.enqueue("test.batch_member", "3", after=[dead])
    assert Job.objects.get(id=too_late).status == "cancelled"
    assert counts(late.id) == ("finished", "failed", 1, 0, 0, 1, 0)
    assert cancelled_signals == [waits, too_late]


def test_fail_fast_holds_from_a_death_while_the_block_is_open(cancelled_signals):
    """A member that dies while the block is open cancels the rest at once, and a member enqueued
    afterwards is cancelled as it joins (the enqueue returns its id); the batch finishes failed
    when the block ends, on_failure once."""
    with rws.batch(on_failure=cb("bad"), on_success=cb("ok"), fail_fast=True) as b:
        b.enqueue("test.batch_member", "fail", max_retries=0, priority=10)
        assert rws.tick()  # it dies, the block still open
        waiting = b.enqueue("test.batch_member", "1", run_in=3600)  # (not due: cancelled by the death?)
        assert Job.objects.get(id=waiting).status == "cancelled"
        assert counts(b.id) == ("open", None, 2, 0, 1, 1, 0)
        late = b.enqueue("test.batch_member", "2")
        assert Job.objects.get(id=late).status == "cancelled"
    assert drain() == 1  # the callback alone
    assert counts(b.id) == ("finished", "failed", 3, 0, 1, 2, 0)
    assert [c["payload"] for c in callbacks()] == ["bad"]
    assert cancelled_signals == [waiting, late]
    assert Run.objects.filter(kind="member").count() == 1


def test_fail_fast_cancels_members_enqueued_before_a_death_in_the_open_block():
    with rws.batch(on_failure=cb("bad"), fail_fast=True) as b:
        b.enqueue("test.batch_member", "fail", max_retries=0, priority=10)
        rest = b.enqueue("test.batch_member", "1", run_in=3600)
        assert rws.tick()  # the death, the block still open
        assert Job.objects.get(id=rest).status == "cancelled"
        assert counts(b.id) == ("open", None, 2, 0, 1, 1, 0)
    drain()
    assert counts(b.id) == ("finished", "failed", 2, 0, 1, 1, 0)


def test_retry_failed_on_a_fail_fast_batch_puts_back_what_it_cancelled():
    """retry_failed puts back the dead members and the members the fail_fast cancelled: the batch
    can then succeed, and on_failure fired once for the one failure."""
    with rws.batch(on_failure=cb("bad"), on_success=cb("ok"), fail_fast=True) as b:
        dead = b.enqueue("test.batch_member", "fail", max_retries=0, priority=10)
        rest = [b.enqueue("test.batch_member", str(i)) for i in range(3)]
    other = rws.enqueue("test.batch_member", "outside")
    assert rws.cancel(other)  # not the fail_fast's: not put back
    drain()
    assert counts(b.id) == ("finished", "failed", 4, 0, 1, 3, 0)
    Job.objects.filter(id=dead).update(payload="fixed")
    assert rws.get_batch(b.id).retry_failed() == 4
    assert counts(b.id) == ("sealed", None, 4, 0, 0, 0, 4)
    drain()
    assert [c["payload"] for c in callbacks()] == ["bad", "ok"]
    assert counts(b.id) == ("finished", "succeeded", 4, 4, 0, 0, 0)
    assert Run.objects.filter(kind="member").count() == 5 and not Job.objects.filter(id__in=rest).exists()
    assert Job.objects.get(id=other).status == "cancelled"


def test_a_member_deleted_while_pending_counts_as_cancelled():
    """rws.delete() of a pending member records it cancelled: the batch fails, and the sweep
    (which counts a member with no job row as succeeded: a worker's success whose member row a
    crash left) has nothing to count."""
    with rws.batch(on_success=cb("ok"), on_failure=cb("bad")) as b:
        b.enqueue("test.batch_member", "1")
        gone = b.enqueue("test.batch_member", "2")
    assert rws.delete(gone)
    drain()
    batch_upkeep.sweep(Store(connections["default"]), 100)
    drain()
    assert counts(b.id) == ("finished", "failed", 2, 1, 0, 1, 0)
    assert [c["payload"] for c in callbacks()] == ["bad"]


def test_what_the_dependency_sweep_cancels_finishes_its_batch(cancelled_signals):
    """A dependency ended by a writer that knows no dependencies (a rust-web-server worker): the
    keeper's sweep cancels what waits for it, records it in its batch and signals it."""
    dep = rws.enqueue("test.batch_member", "x")
    with rws.batch(on_failure=cb("bad")) as b:
        waits = b.enqueue("test.batch_member", "1", after=[dep])
    Job.objects.filter(id=dep).update(status="failed")  # no settle: as another writer ends it
    assert batch_upkeep.sweep_dependencies(Store(connections["default"]), 100) >= 1
    assert counts(b.id) == ("finished", "failed", 1, 0, 0, 1, 0)
    assert cancelled_signals == [waits]
    assert drain() == 1 and [c["payload"] for c in callbacks()] == ["bad"]


def test_deleting_a_dependency_cancels_a_waiting_member_and_finishes_its_batch(cancelled_signals):
    dep = rws.enqueue("test.batch_member", "x")
    with rws.batch(on_failure=cb("bad")) as b:
        waits = b.enqueue("test.batch_member", "1", after=[dep])
    assert rws.delete(dep)
    assert Job.objects.get(id=waits).status == "cancelled"
    assert counts(b.id) == ("finished", "failed", 1, 0, 0, 1, 0)
    assert cancelled_signals == [waits]


def test_the_admins_delete_of_a_dead_dependency_finishes_a_waiting_members_batch(cancelled_signals):
    from django_rws_jobs.api import dead_letters

    dep = rws.enqueue("test.batch_member", "fail", max_retries=0)
    drain()
    with rws.batch(on_failure=cb("bad")) as b:
        waits = b.enqueue("test.batch_member", "1", after=[dep], on_dependency_failure="wait")
    assert dead_letters.delete_where(Job.objects.filter(id=dep, status="failed")) == 1  # as the admin
    dead_letters.after_delete("default", [dep])
    assert Job.objects.get(id=waits).status == "cancelled"
    assert counts(b.id) == ("finished", "failed", 1, 0, 0, 1, 0)
    assert cancelled_signals == [waits]


def test_retry_failed_on_a_fail_fast_batch_puts_a_blocked_member_back_blocked():
    with rws.batch(on_failure=cb("bad"), on_success=cb("ok"), fail_fast=True) as b:
        dead = b.enqueue("test.batch_member", "fail", max_retries=0, priority=10)
        first = b.enqueue("test.batch_member", "1", run_in=3600)
        then = b.enqueue("test.batch_member", "2", after=[first])
    drain()
    assert counts(b.id) == ("finished", "failed", 3, 0, 1, 2, 0)
    Job.objects.filter(id=dead).update(payload="fixed")
    assert rws.get_batch(b.id).retry_failed() == 3
    assert Job.objects.get(id=then).status == "blocked"
    drain()
    assert [c["payload"] for c in callbacks()] == ["bad", "ok"]
    assert [json.loads(r.payload)["payload"] for r in Run.objects.filter(kind="member").order_by("id")][
        -2:
    ] == [
        "1",
        "2",
    ]
