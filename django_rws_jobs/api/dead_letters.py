"""The dead-letter list's operations: retry and delete one job, and retry many at once in a few
statements per batch of ids (the admin's retry-all)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.db.models import Case, QuerySet, Value, When

from ..database import clock
from ..database.backends import backend_for
from ..database.connections import queue_alias
from ..database.validation import INT64_MAX, show, text
from ..database.validation import integer as _int
from ..database.validation import job_id as _job_id
from ..models import Job, Status
from ..queue.store import Store
from ..workflows import dependency_outcomes
from ..workflows.batch_outcomes import cancelled_by_dependencies, record_deleted, reopen_members
from .enqueue import unique_hash

#: The statuses retry() takes back: the dead-letter list and cancelled jobs.
ENDED = (Status.FAILED, Status.CANCELLED)


def back_in_queue() -> Case:
    """The status of a job put back: pending, or waiting when it has a concurrency key; its slot
    is cleared with it (a failed job holds none unless a writer that knows no keys failed it) and
    the promotion gives it one (concurrency_keys.py)."""
    return Case(
        When(concurrency_key__isnull=True, then=Value(str(Status.PENDING))),
        default=Value(str(Status.WAITING)),
    )


def retry(
    job_id: str,
    *,
    using: str | None = None,
    now: int | None = None,
    payload: str | None = None,
    restart: bool = False,
) -> bool:
    """Put a failed or cancelled job back, due now with attempts reset, with ``payload`` instead of
    its own when given (an operator's fix of what made it fail). A long job resumes from its
    checkpoint (its saved steps and cursors); ``restart=True`` clears it, so the job starts from
    the beginning (running/checkpoints.py). One enqueued with
    ``after`` goes back to blocked and is decided again from what it waits for now
    (dependency_outcomes.rewait). False if there is no failed or cancelled job ``job_id``, or if a
    pending or running job already holds its unique key."""
    job_id = _job_id(job_id)
    alias = queue_alias(using)
    now = int(clock.now(alias)) if now is None else _int("now", now, 0, INT64_MAX)
    changes: dict[str, Any] = {} if payload is None else {"payload": text("payload", payload, empty=True)}
    changes.update(_restarted(restart))
    with transaction.atomic(using=alias):
        job = _by_id(alias, job_id).select_for_update().filter(status__in=ENDED).first()
        if job is None:
            return False
        digest = unique_hash(job.job_type, job.unique_key) if job.unique_key is not None else None
        if digest is not None:
            _free_failed_holders(alias, [digest])
        try:
            with transaction.atomic(using=alias):
                changed = (
                    _by_id(alias, job_id)
                    .filter(status__in=ENDED)
                    .update(
                        status=back_in_queue(),
                        concurrency_slot=None,
                        attempts=0,
                        next_run_at=now,
                        unique_hash=digest,
                        locked_by=None,
                        locked_until=None,
                        failed_at=None,
                        task_history=None,  # a retried task starts a new history, as attempts do
                        cancel_requested_at=None,
                        cancelled_at=None,
                        cancelled_by=None,
                        **changes,
                    )
                )
            if changed:
                store = Store(connections[alias])
                reopen_members(store, [job_id])
                dependency_outcomes.reopen(store, [job_id])
                # One that waits for something is decided again (and what that cancels, recorded).
                dependency_outcomes.rewait(store, [job_id], cancelled_by_dependencies)
        except IntegrityError:
            return False
    return changed == 1


def delete(job_id: str, *, using: str | None = None) -> bool:
    """Delete a job that is not running. False when there is no such job. What waits for it
    has a failure (dependency_outcomes.deleted); a batch member deleted before it ended counts as
    cancelled in its batch (batch_outcomes.record_deleted)."""
    job_id = _job_id(job_id)
    alias = queue_alias(using)
    cancelled: list[str] = []
    store = Store(connections[alias])
    with transaction.atomic(using=alias):
        done = delete_where(_by_id(alias, job_id).exclude(status=Status.RUNNING)) > 0
        if done:
            dependency_outcomes.deleted(store, [job_id], cancelled)
            record_deleted(store, [job_id])
    if cancelled:  # (committed: no transaction surrounds the call, or on_commit waits for it)
        transaction.on_commit(lambda: cancelled_by_dependencies(store, cancelled), using=alias)
    return done


def after_delete(alias: str, job_ids: list[str]) -> None:
    """Jobs ``job_ids`` were deleted just now (the admin's deletes, by ``delete_where``): what
    waits for them has a failure (dependency_outcomes.deleted), and what that cancels is recorded in
    its batches and signalled (batch_outcomes.cancelled_by_dependencies)."""
    if job_ids:
        store = Store(connections[alias])
        cancelled: list[str] = []
        dependency_outcomes.deleted(store, job_ids, cancelled)
        if cancelled:
            cancelled_by_dependencies(store, cancelled)


def _free_failed_holders(alias: str, digests: list[str]) -> None:
    """Clear the unique key of failed rows that still hold one of ``digests``: a rust-web-server
    writer leaves it set when a job fails, and only a pending or running job holds its key, as
    enqueue frees such a row (tests/test_dead_letters.py
    test_a_failed_job_holding_the_key_does_not_block_a_retry)."""
    if digests:
        failed = Job.objects.using(alias).filter(unique_hash__in=digests, status=Status.FAILED)
        failed.update(unique_hash=None)


def delete_where(jobs: QuerySet[Job]) -> int:
    """Delete ``jobs`` in one DELETE that keeps their conditions; return how many.

    ``QuerySet.delete()`` reads the rows first and deletes them by primary key alone once any
    delete signal receiver is connected (any app's, with no sender), so a job a worker claimed
    in between would be deleted while it runs. Django's delete signals are not sent for jobs, as
    the worker's own deletes never send them
    (tests/test_dead_letters.py::test_a_delete_keeps_its_status_condition_with_delete_receivers).
    """
    return jobs._raw_delete(jobs.db)


def _by_id(alias: str, job_id: str) -> QuerySet[Job]:
    """The job whose id is exactly ``job_id``, whatever the column's collation (see
    MySQLBackend.exact_id)."""
    return backend_for(connections[alias]).exact_id(Job.objects.using(alias).filter(id=job_id), job_id)


#: Rows per retry_many statement at most: an id in the IN list and up to two CASE parameters
#: each, fewer where a SQLite build allows fewer parameters (_retry_batch_size).
RETRY_BATCH = 1000


def _restarted(restart: bool) -> dict[str, Any]:
    """The changes that start a retried job from the beginning: no checkpoint, no resumptions."""
    if not isinstance(restart, bool):
        raise TypeError(f"restart must be True or False, got {show(restart)}")
    return {"checkpoint": None, "resumptions": None} if restart else {}


def retry_many(
    job_ids: Iterable[str], *, using: str | None = None, now: int | None = None, restart: bool = False
) -> tuple[list[str], list[str]]:
    """``retry`` for many jobs, a few statements per batch of ids instead of several per job.

    Returns (retried, blocked): the failed jobs put back, due now with attempts reset, and the
    failed jobs left alone because another job holds their unique key (as ``retry`` leaves them).
    Ids of no failed job are in neither. Each batch commits on its own.
    """
    retried: list[str] = []
    blocked: list[str] = []
    for done, held in retry_batches(job_ids, using=using, now=now, restart=restart):
        retried += done
        blocked += held
    return retried, blocked


def retry_batches(
    job_ids: Iterable[str], *, using: str | None = None, now: int | None = None, restart: bool = False
) -> Iterator[tuple[list[str], list[str]]]:
    """``retry_many`` a batch at a time: each batch's (retried, blocked) once it has committed,
    so that a caller knows what the batches before a failure did. The ids are checked here, before
    the first batch."""
    if isinstance(job_ids, str):
        raise TypeError(f"job_ids must be an iterable of ids, not the str {show(job_ids)}")
    ids = [_job_id(i) for i in dict.fromkeys(job_ids)]
    alias = queue_alias(using)
    now = int(clock.now(alias)) if now is None else now
    size = _retry_batch_size(connections[alias])
    changes = _restarted(restart)
    return (
        _retry_batch(alias, ids[start : start + size], now, changes) for start in range(0, len(ids), size)
    )


def _retry_batch_size(conn: Any) -> int:
    """Ids per batch: each takes up to three parameters (in the IN list and in the CASE)."""
    limit = backend_for(conn).features.max_query_params
    return RETRY_BATCH if limit is None else max(min(RETRY_BATCH, limit // 3), 1)


def _retry_batch(
    alias: str, ids: list[str], now: int, changes: dict[str, Any]
) -> tuple[list[str], list[str]]:
    """One batch of retry_many, in one transaction: lock the failed rows, leave out those whose
    unique key another row holds, put the rest back in one UPDATE. Pinned by
    tests/test_admin_input.py::test_retry_all_takes_a_bounded_number_of_queries."""
    jobs = Job.objects.using(alias)
    with transaction.atomic(using=alias):
        rows = list(
            jobs.select_for_update()
            .filter(id__in=ids, status=Status.FAILED)
            .values_list("id", "job_type", "unique_key")
        )
        digests = {job_id: unique_hash(t, k) for job_id, t, k in rows if k is not None}
        keys = list(set(digests.values()))
        _free_failed_holders(alias, keys)
        holders = dict(jobs.filter(unique_hash__in=keys).values_list("unique_hash", "id"))
        blocked, taken = [], set()
        for job_id, digest in digests.items():
            if holders.get(digest, job_id) != job_id or digest in taken:
                blocked.append(job_id)  # held by another row, or by a row retried just before
            else:
                taken.add(digest)
        left_out = set(blocked)
        retried = [row[0] for row in rows if row[0] not in left_out]
        if not retried:
            return [], blocked
        keyed = [When(id=i, then=Value(digests[i])) for i in retried if i in digests]
        try:
            with transaction.atomic(using=alias):
                jobs.filter(id__in=retried).update(
                    status=back_in_queue(),
                    concurrency_slot=None,
                    attempts=0,
                    next_run_at=now,
                    unique_hash=Case(*keyed, default=None) if keyed else None,
                    locked_by=None,
                    locked_until=None,
                    failed_at=None,
                    task_history=None,  # a retried task starts a new history, as attempts do
                    **changes,
                )
                store = Store(connections[alias])
                reopen_members(store, retried)
                dependency_outcomes.reopen(store, retried)
                dependency_outcomes.rewait(store, retried, cancelled_by_dependencies)
        except IntegrityError:
            # A key was taken since the look above (an enqueue that committed meanwhile): one by
            # one, as retry() does, which tells which.
            return _retry_each(alias, retried, blocked, now, bool(changes))
    return retried, blocked


def _retry_each(
    alias: str, ids: list[str], blocked: list[str], now: int, restart: bool
) -> tuple[list[str], list[str]]:
    retried: list[str] = []
    for job_id in ids:
        (retried if retry(job_id, using=alias, now=now, restart=restart) else blocked).append(job_id)
    return retried, blocked
