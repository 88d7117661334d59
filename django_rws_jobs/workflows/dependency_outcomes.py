"""What the end of what jobs wait for does to them: blocked jobs resolved (released, cancelled,
or left waiting) when a job or batch they wait for ends (``ended``, ``resolve``), after an
enqueue's commit (``recheck``), by the keeper's ``sweep``, when an operator deletes what they
wait for (``deleted``), and again when a retry puts them back (``rewait``). dependencies.py says
what a dependency is and states the invariants (tests/test_dependencies.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction

from ..database import clock
from ..database.backends.inserts import batches
from ..database.backends.statements import placeholders
from ..flow.concurrency_keys import promote
from ..queue.store import Store
from . import successors
from .successors import SUCCESSOR_POLICY

if TYPE_CHECKING:
    from ..database.backends.claimed import Claimed

logger = logging.getLogger("django_rws_jobs")
#: The statuses of a job that has not ended.
LIVE = ("pending", "running", "waiting", "blocked")
CHUNK = 500


#: What a caller of ``add`` passes to hear of the jobs it cancels: (store, their ids), called
#: after the commit.
OnCancelled = Callable[[Any, list[str]], Any]


def flag(store: Any, job_ids: Sequence[str]) -> None:
    """Mark what the jobs ``job_ids`` wait for as having dependents, whatever its status (a dead
    one may be retried and succeed: its worker then resolves them), each in a short transaction
    of its own (tests/test_dependencies.py::test_a_job_waiting_for_a_dead_job_is_released_by_its_retry).
    The ids are read first: an UPDATE of rws_jobs whose ids come from a subquery scans the whole
    table on MariaDB."""
    for part in batches(iter(job_ids), CHUNK):
        with store.cursor() as c:
            c.execute(
                "SELECT DISTINCT depends_on FROM rws_job_dependencies "
                f"WHERE job_id IN ({placeholders(len(part))}) AND on_batch = FALSE",
                list(part),
            )
            marked = [row[0] for row in c.fetchall()]
        for ids_part in batches(iter(marked), CHUNK):
            with store.writes, store.atomic(), store.cursor() as c:
                c.execute(
                    f"UPDATE rws_jobs SET has_dependents = TRUE WHERE id IN ({placeholders(len(ids_part))}) "
                    "AND (has_dependents IS NULL OR has_dependents = FALSE)",
                    list(ids_part),
                )


def decide(edges: Iterable[tuple[str, str | None]]) -> str:
    """What a blocked job becomes, from its dependencies' (policy, outcome): cancelled if a
    failure's policy cancels, blocked while anything is outstanding (or a failure waits),
    else pending."""
    edges = list(edges)
    if any(o == "failed" and p == "cancel" for p, o in edges):
        return "cancelled"
    if any(o is None or (o == "failed" and p == "wait") for p, o in edges):
        return "blocked"
    return "pending"


#: What a job cancelled because something it waits for failed carries as its error.
CANCELLED_ERROR = 'cancelled: a job or batch it waits for failed (on_dependency_failure="cancel")'


def _set_status(c: Any, job_ids: Sequence[str], status: str, now: int, hint: str = "") -> int:
    """Release (pending, or waiting with a concurrency key) or cancel blocked jobs. ``hint``: the
    backend's primary_key_hint, for a worker's write (see ``ended``)."""
    if status == "cancelled":
        c.execute(
            f"UPDATE rws_jobs{hint} SET status = 'cancelled', cancelled_at = %s, unique_hash = NULL, "
            f"last_error = %s WHERE id IN ({placeholders(len(job_ids))}) AND status = 'blocked'",
            [now, CANCELLED_ERROR, *job_ids],
        )
    else:
        c.execute(
            f"UPDATE rws_jobs{hint} SET status = "
            "CASE WHEN concurrency_key IS NULL THEN 'pending' ELSE 'waiting' END "
            f"WHERE id IN ({placeholders(len(job_ids))}) AND status = 'blocked'",
            list(job_ids),
        )
    return int(c.rowcount)


#: Release the blocked jobs among the given ids that wait for nothing else that has not
#: succeeded (or failed, where the policy runs them anyway): the common case of a success (ended).
RELEASE_SQL = (
    "UPDATE rws_jobs{} SET status = CASE WHEN concurrency_key IS NULL THEN 'pending' ELSE 'waiting' END "
    "WHERE id IN ({}) AND status = 'blocked' "
    "AND NOT EXISTS (SELECT 1 FROM rws_job_dependencies d WHERE d.job_id = rws_jobs.id "
    "AND (d.outcome IS NULL OR (d.outcome = 'failed' AND d.policy <> 'run')))"
)


def ended(store: Any, depends_on: Sequence[str], outcome: str, cancelled: list[str] | None = None) -> int:
    """``depends_on`` (jobs or batches) ended with ``outcome``: set it on what waits for them and
    resolve those jobs, cascading cancels; the ids cancelled are added to ``cancelled``. Returns
    how many jobs were released or cancelled.

    A success costs three statements: a plain read of the jobs that wait, then the outcome and
    RELEASE_SQL, each by those jobs' keys; a failure reads the waiting jobs' dependencies to apply
    their policies. No write looks rows up by what they wait for: that would walk into the rows an
    enqueue inserted and has not committed, and MariaDB would hold this worker's outcomes until
    the enqueue's caller commits (tests/test_dependencies.py::
    test_an_open_enqueue_after_a_running_job_does_not_hold_its_worker). An edge committed after
    the read is the enqueue's ``recheck``'s to resolve."""
    changed = 0
    pending = [(list(depends_on), outcome)]
    hint = store.backend.primary_key_hint()
    while pending:
        ids, result = pending.pop()
        for part in batches(iter(ids), CHUNK // 2):
            marks = placeholders(len(part))
            with store.cursor() as c:
                store.execute(  # (prepared where the worker's statements are: a chain's every step)
                    c,
                    f"SELECT DISTINCT job_id, policy FROM rws_job_dependencies WHERE depends_on IN ({marks}) "
                    "AND (outcome IS NULL OR outcome <> %s)",
                    [*part, result],
                )
                edges = c.fetchall()
            if not edges:
                continue  # nothing waits for them (or this was written before: the sweep's)
            waiting = list(dict.fromkeys(row[0] for row in edges))
            after_holder = {row[0] for row in edges if row[1] == SUCCESSOR_POLICY}
            for some in batches(iter(waiting), CHUNK // 2):
                jobs = placeholders(len(some))
                with store.writes, store.cursor() as c:
                    store.execute(
                        c,
                        f"UPDATE rws_job_dependencies{hint} SET outcome = %s WHERE job_id IN ({jobs}) "
                        f"AND depends_on IN ({marks}) AND (outcome IS NULL OR outcome <> %s)",
                        [result, *some, *part, result],
                    )
                    plain = [j for j in some if j not in after_holder] if after_holder else some
                    if result == "succeeded" and plain:
                        store.execute(c, RELEASE_SQL.format(hint, placeholders(len(plain))), list(plain))
                        changed += c.rowcount
            if result == "succeeded" and not after_holder:
                continue
            if result == "succeeded":
                waiting = list(after_holder)  # successors.release takes the key's hash with the status
            released, cancelled_now = resolve(store, waiting)
            changed += released + len(cancelled_now)
            if cancelled_now:
                pending.append((cancelled_now, "failed"))
                if cancelled is not None:
                    cancelled += cancelled_now
    return changed


def resolve(store: Any, job_ids: Sequence[str]) -> tuple[int, list[str]]:
    """Decide each blocked job among ``job_ids`` from its dependency rows; (how many released,
    the ids cancelled). A replace's successor is released by successors.release, which gives it
    its key's own hash (or cancels it if a newer job took the key)."""
    released = failed = 0
    cancelled: list[str] = []
    for part in batches(iter(dict.fromkeys(job_ids)), CHUNK):
        edges: dict[str, list[tuple[str, str | None]]] = {}
        with store.cursor() as c:
            c.execute(
                f"SELECT d.job_id, d.policy, d.outcome FROM rws_job_dependencies d JOIN rws_jobs j "
                f"ON j.id = d.job_id WHERE d.job_id IN ({placeholders(len(part))}) AND j.status = 'blocked'",
                list(part),
            )
            for job_id, policy, outcome in c.fetchall():
                edges.setdefault(job_id, []).append((policy, outcome))
        by_status: dict[str, list[str]] = {}
        for job_id, its in edges.items():
            status = decide(its)
            if status == "pending" and any(p == SUCCESSOR_POLICY for p, _ in its):
                status = "successor"
            by_status.setdefault(status, []).append(job_id)
        if not by_status.get("pending") and not by_status.get("cancelled") and not by_status.get("successor"):
            continue
        now = int(clock.now(store.conn.alias))
        if by_status.get("successor"):
            count, superseded = successors.release(store, by_status["successor"], now)
            released += count
            cancelled += superseded
        hint = store.backend.primary_key_hint()
        if not by_status.get("pending") and not by_status.get("cancelled"):
            continue
        with store.writes, store.cursor() as c:  # each statement applies to blocked jobs only
            if by_status.get("pending"):
                released += _set_status(c, by_status["pending"], "pending", now, hint)
            if by_status.get("cancelled"):
                _set_status(c, by_status["cancelled"], "cancelled", now, hint)
                cancelled += by_status["cancelled"]
                failed += len(by_status["cancelled"])
    if failed:
        logger.warning("%d blocked job(s) cancelled: a job or batch they wait for failed", failed)
    return released, cancelled


def recheck(
    alias: str, job_ids: Sequence[str], on_cancelled: OnCancelled | None = None, cancelled: Sequence[str] = ()
) -> None:
    """After an enqueue with ``after`` committed: flag what the jobs wait for (``flag``), then
    find the outcome of whatever ended meanwhile and resolve the jobs (see the module's
    invariants); ``on_cancelled`` hears of ``cancelled`` (what the enqueue cancelled) and of what
    this cancels."""

    try:
        store = Store(connections[alias])
        flag(store, job_ids)
        now_cancelled = list(cancelled)
        sweep(store, int(clock.now(alias)), only=job_ids, cancelled=now_cancelled)
        if now_cancelled and on_cancelled is not None:
            on_cancelled(store, now_cancelled)
    except Exception:
        logger.exception(
            "could not resolve %d blocked job(s) after their enqueue; the sweep will", len(job_ids)
        )


def sweep(
    store: Any,
    now: int,
    only: Sequence[str] | None = None,
    limit: int = 500,
    cancelled: list[str] | None = None,
) -> int:
    """Set the outcomes that nobody wrote (a worker killed after its commit, a writer that knows
    no dependencies, an enqueue that crossed an end), then resolve the blocked jobs that have
    all they need. ``only``: just these jobs. Returns how many were released or cancelled; the
    ids cancelled are added to ``cancelled``."""
    where = f" AND d.job_id IN ({placeholders(len(only))})" if only else ""
    args = list(only or ())
    with store.cursor() as c:
        c.execute(
            "SELECT DISTINCT d.depends_on, p.status FROM rws_job_dependencies d LEFT JOIN rws_jobs p "
            "ON p.id = d.depends_on WHERE d.outcome IS NULL AND d.on_batch = FALSE"
            + where
            + " AND (p.id IS NULL OR p.status IN ('failed', 'cancelled')) "
            f"LIMIT {int(limit)}",
            args,
        )
        jobs_ended = c.fetchall()
        c.execute(
            "SELECT DISTINCT d.depends_on, b.state, b.outcome FROM rws_job_dependencies d JOIN rws_batches b "
            "ON b.id = d.depends_on WHERE d.outcome IS NULL AND d.on_batch = TRUE"
            + where
            + " AND b.state IN ('finished', 'cancelled') "
            f"LIMIT {int(limit)}",
            args,
        )
        batches_ended = c.fetchall()
    changed = 0
    succeeded = [dep for dep, status in jobs_ended if status is None]
    failed = [dep for dep, status in jobs_ended if status is not None]
    succeeded += [
        dep for dep, state, outcome in batches_ended if state == "finished" and outcome == "succeeded"
    ]
    failed += [
        dep for dep, state, outcome in batches_ended if not (state == "finished" and outcome == "succeeded")
    ]
    if succeeded:
        changed += ended(store, succeeded, "succeeded", cancelled)
    if failed:
        changed += ended(store, failed, "failed", cancelled)
    with store.cursor() as c:
        c.execute(
            "SELECT j.id FROM rws_jobs j WHERE j.status = 'blocked'"
            + (f" AND j.id IN ({placeholders(len(only))})" if only else "")
            + " AND NOT EXISTS (SELECT 1 FROM rws_job_dependencies d WHERE d.job_id = j.id AND "
            "(d.outcome IS NULL OR (d.outcome = 'failed' AND d.policy = 'wait'))) "
            f"LIMIT {int(limit)}",
            args,
        )
        ready = [row[0] for row in c.fetchall()]
    if ready:
        released, cancelled_now = resolve(store, ready)
        changed += released + len(cancelled_now)
        if cancelled_now:
            if cancelled is not None:
                cancelled += cancelled_now
            changed += ended(store, cancelled_now, "failed", cancelled)
    if only is None:
        changed += abandoned(store, limit, cancelled)
    return changed


def deleted(store: Any, job_ids: Sequence[str], cancelled: list[str] | None = None) -> int:
    """Jobs among ``job_ids`` were deleted by an operator (``rws.delete``, the admin) before they
    succeeded: they will neither succeed nor be retried. What waits for them has a failure, and
    one that would ``wait`` for a retry is cancelled instead: its policy becomes ``cancel``
    (tests/test_dependencies.py::test_deleting_a_dependency_that_did_not_succeed_is_its_failure).
    The ids cancelled are added to ``cancelled``; returns how many jobs were released or
    cancelled."""
    if not job_ids:
        return 0
    waiting: list[str] = []
    with store.writes, store.atomic(), store.cursor() as c:
        for part in batches(iter(job_ids), CHUNK):
            marks = placeholders(len(part))
            c.execute(
                "UPDATE rws_job_dependencies SET outcome = 'failed', "
                "policy = CASE WHEN policy = 'wait' THEN 'cancel' ELSE policy END "
                f"WHERE depends_on IN ({marks}) AND on_batch = FALSE "
                "AND (outcome IS NULL OR outcome <> 'failed' OR policy = 'wait')",
                list(part),
            )
            if c.rowcount:
                c.execute(
                    f"SELECT DISTINCT job_id FROM rws_job_dependencies WHERE depends_on IN ({marks})",
                    list(part),
                )
                waiting += [row[0] for row in c.fetchall()]
    if not waiting:
        return 0
    released, cancelled_now = resolve(store, waiting)
    if cancelled is not None:
        cancelled += cancelled_now
    if cancelled_now:
        released += ended(store, cancelled_now, "failed", cancelled)
    return released + len(cancelled_now)


def abandoned(store: Any, limit: int = 500, cancelled: list[str] | None = None) -> int:
    """``deleted`` for the dead jobs that are gone while something still waits for their retry
    (deleted by a path that does not call ``deleted``: an ORM or SQL delete). Part of the
    keeper's sweep; returns how many jobs were released or cancelled."""
    with store.cursor() as c:
        c.execute(
            "SELECT DISTINCT d.depends_on FROM rws_job_dependencies d WHERE d.outcome = 'failed' "
            "AND d.policy = 'wait' AND d.on_batch = FALSE "
            "AND NOT EXISTS (SELECT 1 FROM rws_jobs p WHERE p.id = d.depends_on) "
            f"LIMIT {int(limit)}"
        )
        gone = [row[0] for row in c.fetchall()]
    return deleted(store, gone, cancelled)


#: Waiting jobs whose rows ``prune`` looks at in one pass: each worker's keeper passes once a
#: recovery interval, so that the rows of up to this many jobs an interval are deleted.
PRUNE_JOBS = 10_000


def prune(store: Any, after: str = "") -> str:
    """Delete the dependency rows of waiting jobs that are gone (succeeded and deleted, pruned
    after their cancel, deleted by an operator): nothing decides or retries a job that is gone, so
    they can no longer matter. A row of a job that is still there stays, whatever its status (a
    failed or cancelled job may be retried, and is decided again from them). One pass looks at
    the rows of up to PRUNE_JOBS waiting jobs, in job id order from ``after``; it returns where the
    next pass starts, "" once it went round
    (tests/test_dependencies.py::test_the_rows_of_jobs_that_are_gone_are_pruned)."""
    with store.cursor() as c:
        c.execute(
            "SELECT DISTINCT job_id FROM rws_job_dependencies WHERE job_id > %s "
            f"ORDER BY job_id LIMIT {PRUNE_JOBS}",
            [after],
        )
        waiting = [row[0] for row in c.fetchall()]
    for part in batches(iter(waiting), CHUNK):
        with store.cursor() as c:
            c.execute(f"SELECT id FROM rws_jobs WHERE id IN ({placeholders(len(part))})", list(part))
            there = {row[0] for row in c.fetchall()}
        gone = [job_id for job_id in part if job_id not in there]
        if gone:
            with store.writes, store.atomic(), store.cursor() as c:
                c.execute(
                    f"DELETE FROM rws_job_dependencies WHERE job_id IN ({placeholders(len(gone))}) "
                    "AND NOT EXISTS (SELECT 1 FROM rws_jobs j WHERE j.id = rws_job_dependencies.job_id)",
                    gone,
                )
    return waiting[-1] if len(waiting) == PRUNE_JOBS else ""


def reopen(store: Any, job_ids: Sequence[str]) -> None:
    """Jobs (or batches) among ``job_ids`` were put back in the queue: what waits for them with
    ``wait`` waits for the new attempt (its outcome is unknown again). Call it in the retry's
    transaction."""
    with store.cursor() as c:
        for part in batches(iter(job_ids), CHUNK):
            marks = placeholders(len(part))
            c.execute(
                f"UPDATE rws_job_dependencies SET outcome = NULL WHERE depends_on IN ({marks}) "
                "AND outcome = 'failed' AND policy = 'wait'",
                list(part),
            )


def rewait(store: Any, job_ids: Sequence[str], on_cancelled: OnCancelled | None = None) -> list[str]:
    """Jobs among ``job_ids`` were put back in the queue (a retry): those that wait for something
    not known to have succeeded go back to ``blocked``, what they wait for that failed is unknown
    again, and after the retry's commit ``recheck`` decides them again from what they wait for
    now (tests/test_dependencies.py::test_a_retried_chain_runs_its_steps_in_order_again). Call it
    in the retry's transaction, after the status update, with at most one IN list of ids (a
    retry_many batch): one statement when none waits for anything. Returns the jobs blocked;
    ``on_cancelled`` hears of those the recheck cancels again, as ``add``'s."""
    if not job_ids:
        return []
    marks = placeholders(len(job_ids))
    with store.cursor() as c:
        c.execute(
            "UPDATE rws_jobs SET status = 'blocked', concurrency_slot = NULL "
            f"WHERE id IN ({marks}) AND status IN ('pending', 'waiting') AND EXISTS (SELECT 1 FROM "
            "rws_job_dependencies d WHERE d.job_id = rws_jobs.id "
            "AND (d.outcome IS NULL OR d.outcome = 'failed'))",
            list(job_ids),
        )
        if not c.rowcount:
            return []
        c.execute(f"SELECT id FROM rws_jobs WHERE id IN ({marks}) AND status = 'blocked'", list(job_ids))
        blocked = [row[0] for row in c.fetchall()]
        # A dependency gone since it failed (a job deleted, a batch pruned) can tell nothing any
        # more: its failure stands.
        c.execute(
            "UPDATE rws_job_dependencies SET outcome = NULL WHERE outcome = 'failed' "
            f"AND job_id IN ({placeholders(len(blocked))}) AND (EXISTS (SELECT 1 FROM rws_jobs p "
            "WHERE p.id = rws_job_dependencies.depends_on) OR EXISTS (SELECT 1 FROM rws_batches b "
            "WHERE b.id = rws_job_dependencies.depends_on))",
            blocked,
        )
    alias = store.conn.alias
    transaction.on_commit(lambda: recheck(alias, blocked, on_cancelled), using=alias)
    return blocked


def release_in_claim(store: Any, finished: Sequence[Claimed], done: set[str], now: int) -> None:
    """Release the jobs that wait for the succeeded ``done`` among ``finished``, and promote the
    keys of those that went to waiting, in the transaction of ``store.finish_and_claim`` (its
    ``release``), so that the claim after it takes them in the same turn: a chain's next step
    starts without a round of its own (SQLite's deletes-with-claim;
    tests/test_batch_workers.py::test_a_chain_of_keyed_jobs_runs_without_polling). Each job
    released for is then marked as having no dependents left, so that batch_outcomes.settle
    does not look again."""
    succeeded = [job.id for job in finished if job.has_dependents and job.id in done]
    if not succeeded:
        return
    if ended(store, succeeded, "succeeded"):
        with store.cursor() as c:
            c.execute(
                "SELECT DISTINCT concurrency_key FROM rws_jobs WHERE status = 'waiting' "
                "AND concurrency_key IS NOT NULL AND id IN (SELECT job_id FROM rws_job_dependencies "
                f"WHERE depends_on IN ({placeholders(len(succeeded))}))",
                succeeded,
            )
            keys = [row[0] for row in c.fetchall()]
        if keys:
            promote(store, keys, now, in_transaction=True)
    released_for = set(succeeded)
    for job in finished:
        if job.id in released_for:
            job.has_dependents = False
