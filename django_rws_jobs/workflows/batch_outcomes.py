"""What a batch's members' outcomes do to it: the member rows, the finish and its callbacks.

Invariants (docs/explanation/batches.md; tests/test_batches.py):

- A member's row in ``rws_batch_members`` is deleted when the member succeeds and given an
  outcome (failed, cancelled) when it ends otherwise: set operations, so that writing one twice
  (a job run again after its lease expired, the sweep after a worker) changes nothing.
- They are written after the job's own outcome has committed (``settle``), and only while the
  job's row still has that outcome (a retry in between keeps the member outstanding). A worker
  that dies between the two leaves the member outstanding with its job ended: ``batch_upkeep.sweep``
  reconciles it from the job's row, which is the truth (no row: it succeeded; ``rws.delete`` of
  a member that had not ended records it cancelled in its own transaction).
- Every path that cancels members records them and sends ``job_cancelled`` once committed: a
  batch's cancel and fail_fast (``cancel_outstanding``, then ``cancelled_by_batch``), and the
  dependency cascade (dependencies.py hands the ids back: ``settle``,
  ``cancelled_by_dependencies``). fail_fast holds from the first death, the block open or not
  (``try_finish``, ``cancel_if_failing``).
- ``try_finish`` probes for an outstanding member after those commits, so whichever writer ends
  the last member sees none. The finish itself is a compare-and-set of the batch row from
  ``sealed`` to ``finished`` on its generation, with the callbacks inserted in the same
  transaction: of the writers that saw nothing outstanding, one wins it, and each callback is
  enqueued once per finish. ``retry_failed`` (and any retry of a member) bumps the generation,
  so that a finish decided before it cannot be written after it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from django.db import Error as DatabaseError
from django.db import transaction

from ..database import clock
from ..database.backends.base import is_registered
from ..database.backends.claimed import Claimed
from ..database.backends.inserts import INSERT_COLUMNS, INSERT_SQL, batches
from ..database.backends.statements import placeholders
from ..database.connections import is_transient
from ..flow.concurrency_keys import promote
from ..models import Job
from ..queue import ids
from ..signals import send_cancelled
from . import dependency_outcomes

logger = logging.getLogger("django_rws_jobs")

#: A callback's row: the parameters ``api.prepare`` makes, where these are filled at the finish.
ROW_ID, ROW_DUE, ROW_CREATED, ROW_KEY, ROW_BATCH, ROW_EVENT, ROW_METADATA = 0, 4, 5, 11, 13, 14, 15
#: How many INSERT parameters a row has (inserts.INSERT_COLUMNS); a call() stored before the
#: metadata column (migration 0020) has one fewer, and gets None for it.
ROW_LENGTH = len(INSERT_COLUMNS)
#: What a member cancelled by its fail_fast batch carries as its error, and as who cancelled it
#: (``retry_failed`` puts those back).
FAIL_FAST_MESSAGE = "cancelled: another member of its batch (fail_fast) moved to the dead-letter list"
FAIL_FAST_BY = "fail_fast"
#: Ids in one IN list.
CHUNK = 500


def settle(store: Any, ended: Iterable[tuple[Claimed, str]], now: int) -> int:
    """Write what became of the members among ``ended`` (a job with what ``record`` returned:
    "done", "dead", "cancelled"; others change nothing), then finish their batches where nothing
    is left, and resolve what waits for them: the jobs that cancels are recorded in their batches
    too, and ``job_cancelled`` is sent for each. Returns how many batches finished plus how many
    waiting jobs were released or cancelled (a worker wakes its dispatcher when any).

    A success knows its batch from its deletion (``Claimed.batch_id``); a death or a cancel, rare,
    is looked up in the member rows. Jobs that succeeded outside batches, with no dependents,
    cost nothing here."""
    ended = list(ended)
    cascade: list[str] = []
    resolved = _settle_dependents(store, ended, cascade)
    done = [(job.id, job.batch_id) for job, result in ended if result == "done" and job.batch_id is not None]
    dead = [job.id for job, result in ended if result == "dead"]
    cancelled = [job.id for job, result in ended if result == "cancelled"]
    if not done and not dead and not cancelled and not cascade:
        return resolved
    finished = record_members(store, done, dead, cancelled + cascade, now)
    if cascade:
        send_cancelled_signals(store, cascade)
    return resolved + finished


def record_members(
    store: Any, done: Sequence[tuple[str, str]], dead: Sequence[str], cancelled: Sequence[str], now: int
) -> int:
    """Write the member rows of jobs that ended (succeeded, with their batches: deleted; died:
    failed; cancelled), then finish their batches where nothing is left; how many finished.

    Each write applies only while the job's row still says so (no row for a success, ``failed``,
    ``cancelled``): a retry that put the job back before this write keeps its member outstanding
    (tests/test_batches.py::test_a_death_settled_after_a_retry_leaves_the_member_outstanding)."""
    touched: dict[str, bool] = {batch_id: False for _, batch_id in done}
    with store.writes:
        with store.cursor() as c:
            for part in batches((job_id for job_id, _ in done), CHUNK):
                c.execute(
                    f"DELETE FROM rws_batch_members WHERE job_id IN ({placeholders(len(part))}) "
                    "AND NOT EXISTS (SELECT 1 FROM rws_jobs j WHERE j.id = rws_batch_members.job_id)",
                    list(part),
                )
        for outcome, job_ids in (("failed", dead), ("cancelled", cancelled)):
            for part in batches(iter(job_ids), CHUNK):
                # The job rows that still have the outcome, locked until the member rows are
                # written: a retry (which locks the job row first) comes wholly before or after.
                with store.atomic(), store.cursor() as c:
                    c.execute(
                        f"SELECT id FROM rws_jobs WHERE id IN ({placeholders(len(part))}) AND status = %s"
                        + store.features.row_lock,
                        [*part, outcome],
                    )
                    still = [row[0] for row in c.fetchall()]
                    if not still:
                        continue
                    marks = placeholders(len(still))
                    c.execute(f"SELECT batch_id FROM rws_batch_members WHERE job_id IN ({marks})", still)
                    for (batch_id,) in c.fetchall():
                        touched[batch_id] = touched.get(batch_id, False) or outcome == "failed"
                    c.execute(
                        f"UPDATE rws_batch_members SET outcome = %s WHERE job_id IN ({marks}) "
                        "AND outcome IS NULL",
                        [outcome, *still],
                    )
    return finish_each(store, touched.items(), now)


def finish_each(store: Any, batch_ids: Iterable[tuple[str, bool]], now: int) -> int:
    """``try_finish`` each of ``(batch id, check_fail_fast)``; returns how many finished. A batch
    whose finish fails for a reason of its own (a callback row the database refuses, stored
    callbacks that do not parse) is logged and skipped, its own transaction rolled back, and the
    others go on; the next sweep tries it again. An error that may pass (a lost connection) is
    raised. (tests/test_batches.py::test_a_batch_whose_finish_fails_is_skipped_and_the_sweep_goes_on)"""
    finished = 0
    for batch_id, check_fail_fast in batch_ids:
        try:
            finished += try_finish(store, batch_id, now, check_fail_fast)
        except Exception as exc:
            if isinstance(exc, DatabaseError) and is_transient(exc):
                raise
            logger.exception("batch %s: its finish failed; skipped until the next sweep", batch_id)
    return finished


def _settle_dependents(store: Any, ended: list[tuple[Claimed, str]], cascade: list[str]) -> int:
    """What waits for the jobs among ``ended`` (dependencies.py): a success resolves the
    dependents of a job that has any (its flag, as its deletion read it); a death
    or a cancel is looked up whatever the flag says (rare, and the flag may be older). The jobs
    that cancels are added to ``cascade``."""
    succeeded = [job.id for job, result in ended if result == "done" and job.has_dependents]
    failed = [job.id for job, result in ended if result in ("dead", "cancelled")]
    resolved = 0
    if succeeded:
        resolved += dependency_outcomes.ended(store, succeeded, "succeeded", cascade)
    if failed:
        resolved += dependency_outcomes.ended(store, failed, "failed", cascade)
    return resolved


def cancelled_by_dependencies(store: Any, job_ids: list[str]) -> int:
    """Jobs the dependency resolution cancelled (dependencies.add's ``on_cancelled``; what waits
    for them resolved already): record them in their batches, finish those, send job_cancelled."""
    finished = record_members(store, (), (), job_ids, _now(store))
    send_cancelled_signals(store, job_ids)
    return finished


def cancelled_by_batch(store: Any, job_ids: list[str], now: int) -> int:
    """Members their batch cancelled (``cancel_outstanding``, committed): resolve what waits for
    them, record what that cancels, and send job_cancelled for all of them."""
    cascade: list[str] = []
    resolved = 0
    if job_ids:
        resolved = dependency_outcomes.ended(store, job_ids, "failed", cascade)
    if cascade:
        resolved += record_members(store, (), (), cascade, now)
    send_cancelled_signals(store, [*job_ids, *cascade])
    return resolved


def send_cancelled_signals(store: Any, job_ids: Sequence[str]) -> None:
    """Send job_cancelled for each of ``job_ids`` that is cancelled, as its row is now; after the
    caller's transaction commits when the store is the caller's own connection (``tick()``)."""
    if not job_ids:
        return
    jobs = _read_jobs(store, job_ids, "cancelled")

    def send() -> None:
        for job in jobs:
            send_cancelled(job)

    if is_registered(store.conn):
        transaction.on_commit(send, using=store.conn.alias)
    else:
        send()


def _read_jobs(store: Any, job_ids: Sequence[str], status: str) -> list[Job]:
    """The rows of ``job_ids`` that have ``status``, read on the store's own connection (a
    worker's is not Django's) and converted as the ORM converts them."""
    conn = store.conn
    fields = Job._meta.concrete_fields
    converters = [
        (f, conn.ops.get_db_converters(f.get_col(Job._meta.db_table)) + f.get_db_converters(conn))
        for f in fields
    ]
    columns = ", ".join(conn.ops.quote_name(f.column) for f in fields)
    jobs = []
    with store.cursor() as c:
        for part in batches(iter(job_ids), CHUNK):
            c.execute(
                f"SELECT {columns} FROM rws_jobs WHERE id IN ({placeholders(len(part))}) AND status = %s",
                [*part, status],
            )
            for row in c.fetchall():
                values = []
                for (field, convert), value in zip(converters, row, strict=True):
                    for converter in convert:
                        value = converter(value, field.get_col(Job._meta.db_table), conn)
                    values.append(value)
                jobs.append(Job.from_db(conn.alias, [f.attname for f in fields], values))
    return jobs


def _now(store: Any) -> int:
    return int(clock.now(store.conn.alias))


def try_finish(
    store: Any,
    batch_id: str,
    now: int,
    check_fail_fast: bool = False,
    before_finish: Callable[[], None] | None = None,
) -> bool:
    """Finish a sealed batch whose members have all ended, and enqueue its callbacks, in one
    transaction won by one writer; False if it is not sealed, something is outstanding, or
    another writer finished it. ``check_fail_fast``: a member died, so a fail_fast batch cancels
    the rest first. ``before_finish`` runs between the probes and the compare-and-set (tests
    force two writers to interleave there)."""
    with store.cursor() as c:
        c.execute("SELECT state, generation, fail_fast, callbacks FROM rws_batches WHERE id = %s", [batch_id])
        row = c.fetchone()
    if row is None or row[0] not in ("open", "sealed"):
        return False
    state, generation, fail_fast, callbacks = row
    if fail_fast and check_fail_fast and _any_died(store, batch_id):
        # From the first death, the block still open or not
        # (tests/test_batches.py::test_fail_fast_holds_from_a_death_while_the_block_is_open).
        cancelled_by_batch(
            store, cancel_outstanding(store, batch_id, now, FAIL_FAST_MESSAGE, FAIL_FAST_BY), now
        )
    if state != "sealed":
        return False
    with store.cursor() as c:
        c.execute(
            "SELECT 1 FROM rws_batch_members WHERE batch_id = %s AND outcome IS NULL LIMIT 1", [batch_id]
        )
        if c.fetchone() is not None:
            return False
        c.execute(
            "SELECT 1 FROM rws_batch_members WHERE batch_id = %s AND outcome IS NOT NULL LIMIT 1", [batch_id]
        )
        outcome = "failed" if c.fetchone() is not None else "succeeded"
    if before_finish is not None:
        before_finish()
    events = ["finish", "success" if outcome == "succeeded" else "failure"]
    rows = callback_rows(json.loads(callbacks or "{}"), events, batch_id, now)
    with store.writes, store.atomic(), store.cursor() as c:
        c.execute(
            "UPDATE rws_batches SET state = 'finished', outcome = %s, finished_at = %s "
            "WHERE id = %s AND state = 'sealed' AND generation = %s",
            [outcome, now, batch_id, generation],
        )
        if c.rowcount != 1:
            return False
        for params in rows:
            c.execute(INSERT_SQL, params)
    logger.info("batch %s finished: %s; %d callback(s) enqueued", batch_id, outcome, len(rows))
    cascade: list[str] = []
    dependency_outcomes.ended(store, [batch_id], outcome, cascade)
    if cascade:
        cancelled_by_dependencies(store, cascade)
    keys = [params[ROW_KEY] for params in rows if params[ROW_KEY] is not None]
    if keys:
        promote(store, keys, now)
    return True


def after_cancel(store: Any, batch_id: str, job_ids: list[str], now: int) -> None:
    """A batch was cancelled (committed) with ``job_ids`` of its members: what waits for them and
    for the batch (it failed) is resolved, and job_cancelled sent for all that cancelled."""
    cancelled_by_batch(store, job_ids, now)
    cascade: list[str] = []
    dependency_outcomes.ended(store, [batch_id], "failed", cascade)
    if cascade:
        cancelled_by_dependencies(store, cascade)


def _any_died(store: Any, batch_id: str) -> bool:
    with store.cursor() as c:
        c.execute(
            "SELECT 1 FROM rws_batch_members WHERE batch_id = %s AND outcome = 'failed' LIMIT 1", [batch_id]
        )
        return c.fetchone() is not None


def callback_rows(
    callbacks: dict[str, list[list[Any]]], events: list[str], batch_id: str, now: int
) -> list[list[Any]]:
    """The INSERT parameters of the callbacks of ``events``: each stored row (batches.call) with
    a new id, due as long after ``now`` as it was after its call, and its batch and event."""
    rows = []
    for event in events:
        for stored in callbacks.get(event, ()):
            params = fresh_row(stored, now)
            params[ROW_BATCH] = batch_id
            params[ROW_EVENT] = event
            rows.append(params)
    return rows


def fresh_row(stored: Sequence[Any], now: int) -> list[Any]:
    """A copy of INSERT parameters made earlier (a ``call()``), as enqueued at ``now``: a new id,
    created now, due as long after now as it was after its making."""
    params = list(stored)
    if len(params) == ROW_LENGTH - 1:
        params.insert(ROW_METADATA, None)
    delay = params[ROW_DUE] - params[ROW_CREATED]
    params[ROW_ID] = ids.new_id()
    params[ROW_CREATED] = now
    params[ROW_DUE] = now + max(delay, 0)
    return params


def cancel_outstanding(store: Any, batch_id: str, now: int, error: str, by: str | None = None) -> list[str]:
    """Cancel the members of ``batch_id`` that have not ended: pending, waiting and blocked ones
    at once, with their member rows; running ones asked (their workers end them cancelled).
    Returns the ids cancelled at once: once this commits, pass them to ``cancelled_by_batch``
    (what waits for them, job_cancelled). The keys whose slots they held get their next jobs
    promoted (tests/test_batches.py::test_a_cancel_also_cancels_blocked_members)."""
    outstanding = "SELECT job_id FROM rws_batch_members WHERE batch_id = %s AND outcome IS NULL"
    with store.writes, store.atomic(), store.cursor() as c:
        c.execute(
            "SELECT id, concurrency_key, concurrency_slot FROM rws_jobs WHERE id IN (" + outstanding + ") "
            "AND status IN ('pending', 'waiting', 'blocked')",
            [batch_id],
        )
        rows = c.fetchall()
        keys = sorted({key for _, key, slot in rows if key is not None and slot is not None})
        ids = [row[0] for row in rows]
        cancelled: list[str] = []
        for part in batches(iter(ids), CHUNK):
            marks = placeholders(len(part))
            c.execute(
                "UPDATE rws_jobs SET status = 'cancelled', cancelled_at = %s, cancelled_by = %s, "
                "last_error = %s, unique_hash = NULL, concurrency_slot = NULL "
                f"WHERE id IN ({marks}) AND status IN ('pending', 'waiting', 'blocked')",
                [now, by, error, *part],
            )
            c.execute(  # (what this statement cancelled: a row cancelled otherwise has another error)
                f"SELECT id FROM rws_jobs WHERE id IN ({marks}) AND status = 'cancelled' "
                "AND cancelled_at = %s AND last_error = %s",
                [*part, now, error],
            )
            cancelled += [row[0] for row in c.fetchall()]
        c.execute(
            "UPDATE rws_jobs SET cancel_requested_at = %s, cancelled_by = %s, unique_hash = NULL "
            "WHERE id IN (" + outstanding + ") AND status = 'running' AND cancel_requested_at IS NULL",
            [now, by, batch_id],
        )
        c.execute(
            "UPDATE rws_batch_members SET outcome = 'cancelled' WHERE batch_id = %s AND outcome IS NULL "
            "AND EXISTS (SELECT 1 FROM rws_jobs j WHERE j.id = rws_batch_members.job_id "
            "AND j.status = 'cancelled')",
            [batch_id],
        )
    if keys:
        promote(store, keys, now)
    if cancelled:
        logger.warning("batch %s: %d member(s) cancelled", batch_id, len(cancelled))
    return cancelled


def cancel_if_failing(conn: Any, batch_id: str, job_ids: list[str]) -> None:
    """Members joining an open fail_fast batch that has a dead member already are cancelled at
    once, in the enqueue's transaction (their member rows too), and job_cancelled is sent for
    them after it commits: fail_fast holds from the first death, and the enqueue still returns
    their ids (tests/test_batches.py::test_fail_fast_holds_from_a_death_while_the_block_is_open)."""
    if not job_ids:
        return
    with conn.cursor() as c:
        c.execute(
            "SELECT 1 FROM rws_batches b WHERE b.id = %s AND b.fail_fast = %s AND EXISTS (SELECT 1 FROM "
            "rws_batch_members m WHERE m.batch_id = b.id AND m.outcome = 'failed')",
            [batch_id, True],
        )
        if c.fetchone() is None:
            return
        now = int(clock.now(conn.alias))
        for part in batches(iter(job_ids), CHUNK):
            marks = placeholders(len(part))
            c.execute(
                "UPDATE rws_jobs SET status = 'cancelled', cancelled_at = %s, cancelled_by = %s, "
                "last_error = %s, unique_hash = NULL, concurrency_slot = NULL "
                f"WHERE id IN ({marks}) AND status IN ('pending', 'waiting', 'blocked')",
                [now, FAIL_FAST_BY, FAIL_FAST_MESSAGE, *part],
            )
            c.execute(
                f"UPDATE rws_batch_members SET outcome = 'cancelled' WHERE job_id IN ({marks}) "
                "AND outcome IS NULL",
                list(part),
            )
    logger.warning("batch %s: %d member(s) cancelled as they joined (fail_fast)", batch_id, len(job_ids))
    alias = conn.alias
    ids_ = list(job_ids)
    transaction.on_commit(lambda: _signal_joined(alias, ids_), using=alias)


def _signal_joined(alias: str, job_ids: list[str]) -> None:
    for job in Job.objects.using(alias).filter(id__in=job_ids, status="cancelled"):
        send_cancelled(job)


def record_deleted(store: Any, job_ids: Sequence[str]) -> None:
    """Jobs among ``job_ids`` were deleted, in this transaction, by an operator (``rws.delete``):
    a member that had not ended counts as cancelled, and its batch finishes after the commit.
    Only a worker's success deletes a member's job row otherwise, and the sweep counts a member
    left outstanding with no job row as that success
    (tests/test_batches.py::test_a_member_deleted_while_pending_counts_as_cancelled)."""
    touched: list[str] = []
    with store.cursor() as c:
        for part in batches(iter(job_ids), CHUNK):
            marks = placeholders(len(part))
            c.execute(
                f"SELECT DISTINCT batch_id FROM rws_batch_members WHERE job_id IN ({marks}) "
                "AND outcome IS NULL",
                list(part),
            )
            touched += [row[0] for row in c.fetchall()]
            c.execute(
                f"UPDATE rws_batch_members SET outcome = 'cancelled' WHERE job_id IN ({marks}) "
                "AND outcome IS NULL AND NOT EXISTS "
                "(SELECT 1 FROM rws_jobs j WHERE j.id = rws_batch_members.job_id)",
                list(part),
            )
    if touched:
        alias = store.conn.alias

        def finish() -> None:
            try:
                for batch_id in touched:
                    try_finish(store, batch_id, _now(store))
            except Exception:
                logger.exception("could not finish the batches of deleted members: the sweep will")

        transaction.on_commit(finish, using=alias)


def reopen_members(store: Any, job_ids: Sequence[str]) -> int:
    """Members among ``job_ids`` were put back in the queue (a retry): outstanding again, and
    their batches sealed again one generation later, so that a finish decided before cannot be
    written and the batch finishes again once they end. Call it in the retry's transaction."""
    reopened = 0
    with store.cursor() as c:
        for part in batches(iter(job_ids), CHUNK):
            args = list(part)
            marks = placeholders(len(part))
            c.execute(
                f"SELECT DISTINCT batch_id FROM rws_batch_members WHERE job_id IN ({marks}) "
                "AND outcome IS NOT NULL",
                args,
            )
            batch_ids = [row[0] for row in c.fetchall()]
            if batch_ids:
                c.execute(
                    "UPDATE rws_batches SET generation = generation + 1, state = 'sealed', outcome = NULL, "
                    "finished_at = NULL WHERE state IN ('sealed', 'finished') "
                    f"AND id IN ({placeholders(len(batch_ids))})",
                    batch_ids,
                )
                dependency_outcomes.reopen(store, batch_ids)
            c.execute(
                f"UPDATE rws_batch_members SET outcome = NULL WHERE job_id IN ({placeholders(len(part))}) "
                "AND outcome IS NOT NULL",
                args,
            )
            reopened += c.rowcount
    return reopened
