"""enqueue, jobs and failed_jobs: rust-web-server's methods, for Django (enqueue_many is in
enqueue_many.py, retry and delete in dead_letters.py, tick in worker/tick.py)."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from django.db import DatabaseError, connections, transaction

from ..conf import jobs_settings
from ..database import clock, wakeup
from ..database.backends import backend_for
from ..database.backends.cursors import kept_cursor
from ..database.backends.inserts import INSERT_SQL
from ..database.connections import queue_alias
from ..database.validation import (
    INT32_MAX,
    INT64_MAX,
    INT64_MIN,
    KEY_MAX,
    UNIQUE_MAX,
    due_at,
    queue_name,
)
from ..database.validation import concurrency_limit as _concurrency_limit
from ..database.validation import integer as _int
from ..database.validation import text as _text
from ..database.validation import timeout as _timeout
from ..flow.concurrency_keys import promote
from ..models import Job, Status
from ..queue import ids, middleware
from ..queue.metadata import metadata_text
from ..queue.registry import registry
from ..queue.store import Store
from ..queue.unique_keys import unique_hash
from ..workflows import dependencies
from ..workflows.batch_outcomes import cancel_if_failing, cancelled_by_dependencies
from ..workflows.members import join, open_batch
from .enqueue_once import (
    STORED,
    Enqueued,
    Once,
    Skipped,
    Stored,
    insert_once,
    insert_unique,
    once_options,
)

logger = logging.getLogger("django_rws_jobs")


def prepare(
    job_type: Any,
    payload: Any = "",
    *,
    queue: Any = None,
    priority: Any = None,
    run_at: Any = None,
    run_in: Any = None,
    unique: Any = None,
    max_retries: Any = None,
    timeout: Any = None,
    concurrency_key: Any = None,
    concurrency_limit: Any = None,
    metadata: Any = None,
    now: float | None = None,
) -> list[Any]:
    """Validate one job's arguments and return its INSERT parameters (the id included).

    A job with a ``concurrency_key`` goes in waiting, with its limit: ``concurrency_limit`` (a
    task's), else its type's ``@job(concurrency_limit=)``, else 1; a promotion makes it pending
    once the key has a free slot (concurrency_keys.py): enqueue's own at commit, or a worker's."""
    job_type = _text("job_type", job_type)
    payload = _text("payload", payload, empty=True)
    spec = registry.get(job_type)
    defaults = spec.options if spec is not None else {}
    queue = queue_name(defaults.get("queue", "default") if queue is None else queue)
    if priority is None:
        priority = defaults.get("priority", 0)
    priority = _int("priority", priority, INT64_MIN, INT64_MAX)
    if max_retries is None:
        max_retries = defaults.get("max_retries", jobs_settings.MAX_RETRIES)
    max_retries = _int("max_retries", max_retries, 0, INT32_MAX)
    if unique is not None:
        unique = _text("unique key", unique, limit=UNIQUE_MAX)
    status, limit = "pending", None
    if concurrency_key is not None:
        concurrency_key = _text("concurrency_key", concurrency_key, limit=KEY_MAX)
        if concurrency_limit is None:
            concurrency_limit = defaults.get("concurrency_limit")
        limit = 1 if concurrency_limit is None else _concurrency_limit(concurrency_limit)
        status = "waiting"
    now = clock.now() if now is None else now
    due = due_at(run_at, run_in, now)
    return [
        ids.new_id(),
        job_type,
        payload,
        max_retries,
        due,
        int(now),
        queue,
        priority,
        unique,
        _timeout(timeout),
        status,
        concurrency_key,
        limit,
        None,  # batch_id: set where a batch takes the job (batches.py)
        None,  # batch_event
        None if metadata is None else metadata_text(metadata),
        unique_hash(job_type, unique) if unique is not None else None,
    ]


def enqueue(
    job_type: str,
    payload: str = "",
    *,
    queue: str | None = None,
    priority: int | None = None,
    run_at: dt.datetime | None = None,
    run_in: dt.timedelta | float | None = None,
    unique: str | None = None,
    max_retries: int | None = None,
    timeout: float | None = None,
    concurrency_key: str | None = None,
    after: list[Any] | None = None,
    on_dependency_failure: str = "cancel",
    metadata: dict[str, Any] | None = None,
    using: str | None = None,
    on_conflict: str = "skip",
    max_delay: dt.timedelta | float | None = None,
    unique_for: dt.timedelta | float | None = None,
) -> str:
    """Store a job and return its id; inside ``transaction.atomic()`` it commits with the caller.

    With ``unique=key``, while a job of this type and key is pending or running nothing is
    inserted and that job's id is returned (the database enforces it across processes).
    ``on_conflict="replace"``: a waiting holder takes this call's payload, due time and options
    instead (a running one is never changed: a job is stored to run after it, keyed the same), and
    ``max_delay`` seconds bounds how late replaces make it due; ``unique_for`` seconds keeps the key
    taken that long after the enqueue that took it, even once that job succeeded (a throttle).
    The id returned is a ``str`` whose ``outcome`` says what the call did: "stored", "skipped" or
    "replaced" (api/enqueue_once.py).
    ``timeout`` (seconds) is this job's time limit; None leaves it to its type's, or the setting's.
    With ``concurrency_key``, at most its type's ``concurrency_limit`` (1 unless set) jobs with
    that key run at once, across every worker; the others wait, uncharged.
    With ``after=[job ids and batches]`` the job is stored blocked and runs once each of them has
    succeeded; ``on_dependency_failure`` says what a failure of one does: "cancel" this job (and
    what waits on it), "run" it anyway, or "wait" until the failed one is retried and succeeds.
    ``metadata``: a dict (JSON, at most METADATA_MAX_BYTES of it) the job carries: ``Job.metadata``,
    and ``current_job().metadata`` in its handler.
    """
    alias = queue_alias(using)
    once = (
        None
        if on_conflict == "skip" and max_delay is None and unique_for is None
        else once_options(unique, on_conflict, max_delay, unique_for, after)
    )
    deps = waits_for(after, on_dependency_failure)
    params = prepare(
        job_type,
        payload,
        queue=queue,
        priority=priority,
        run_at=run_at,
        run_in=run_in,
        unique=unique,
        max_retries=max_retries,
        timeout=timeout,
        concurrency_key=concurrency_key,
        metadata=metadata,
        now=clock.now(alias),
    )
    enqueuers = middleware.chains()[0]
    if not enqueuers:
        return insert_prepared(alias, params, deps, once)
    # The middleware sees a job that is valid, and may change its metadata only.
    job = middleware.Enqueue(params[1], params[6], dict(metadata or {}), False, alias)

    def call_next() -> str:
        params[15] = metadata_text(job.metadata) if job.metadata else None
        job.ids = [insert_prepared(alias, params, deps, once)]
        return job.ids[0]

    return middleware.enqueue_around(enqueuers, job, call_next)


def waits_for(after: Any, policy: Any) -> tuple[list[tuple[str, bool]], str] | None:
    """``after`` and ``on_dependency_failure`` checked: (what the job waits for, the policy)."""
    if after is None:
        if policy != "cancel":
            dependencies.policy(policy)  # an unknown one is named first
            raise TypeError(f"on_dependency_failure={policy!r} needs after=[...]")
        return None
    deps = dependencies.targets(after, policy)
    inside = open_batch.get()
    if inside is not None and (inside[0], True) in deps:
        raise ValueError(
            f"a job enqueued inside batch {inside[0]} cannot wait for it: "
            "as a member, the batch would wait for it in turn"
        )
    return deps, policy


#: Runs of a replace or a throttle that deadlocked, in a transaction of its own.
DEADLOCK_TRIES = 5


def insert_prepared(
    alias: str,
    params: list[Any],
    deps: tuple[list[tuple[str, bool]], str] | None = None,
    once: Once | None = None,
    again: bool = False,
) -> Enqueued:
    """Insert one job that ``prepare`` made, in the caller's transaction; return its id (or, for
    a unique job, the id of the live job holding its key, or of the one it replaced: ``once``).
    Wakes this process's workers at commit. ``deps``: what it waits for and the policy
    (dependencies.py); it is stored blocked.

    A replace or a throttle that the database ends with a deadlock (MariaDB's InnoDB, under
    contention on one key: the whole transaction is rolled back) runs again (``again``) when the
    transaction was this call's own; inside the caller's, the error is raised, as the database
    asks, for the caller to run its transaction again (tests/test_enqueue_once.py, the races)."""
    backend = backend_for(connections[alias])
    backend.check_insert_size(params, "the job")
    if once is not None and not again and not connections[alias].in_atomic_block:
        for _ in range(DEADLOCK_TRIES - 1):
            try:
                return insert_prepared(alias, list(params), deps, once, again=True)
            except DatabaseError as exc:
                if not backend.deadlocked(exc):
                    raise
        return insert_prepared(alias, params, deps, once, again=True)
    member_of = open_batch_id(alias)
    if deps is not None:
        params[10] = "blocked"
    if member_of is not None or deps is not None:
        # The job, its member row, the batch's total and its dependencies in one transaction.
        params[13] = member_of
        with transaction.atomic(using=alias):
            job_id = _insert_one(alias, params, once)
            if job_id.outcome == STORED:  # a job already live is neither a member nor blocked
                if member_of is not None:
                    join(connections[alias], member_of, [job_id])
                    cancel_if_failing(connections[alias], member_of, [job_id])
                if deps is not None:
                    params[10] = dependencies.add(
                        connections[alias], job_id, *deps, on_cancelled=cancelled_by_dependencies
                    )
    else:
        job_id = _insert_one(alias, params, once)
    if params[11] is not None and params[4] <= params[5] and params[10] != "blocked":
        _promote_at_commit(alias, params[11])  # a due job with a concurrency key
    wake_local_workers(alias)
    return job_id


def _insert_one(alias: str, params: list[Any], once: Once | None = None) -> Enqueued:
    if params[-1] is None:
        _insert(connections[alias], params)
        return Stored(params[0])
    if once is not None:
        return insert_once(alias, params, once)
    job_id = insert_unique(alias, params)
    return Stored(job_id) if job_id == params[0] else Skipped(job_id)


def open_batch_id(alias: str) -> str | None:
    """The id of the batch open in this context (batches.batch), which takes the jobs enqueued
    now; ValueError for a job of another database than the batch's."""
    member_of = open_batch.get()
    if member_of is None:
        return None
    batch_id, batch_alias = member_of
    if alias != batch_alias:
        raise ValueError(
            f"a job enqueued on database {alias!r} inside batch {batch_id}, which is on {batch_alias!r}: "
            "a batch's members are on its own database"
        )
    return batch_id


def _promote_at_commit(alias: str, key: str) -> None:
    """Once the job commits, make it pending if its key has a free slot, as the workers' sweep
    would, so that a job of a free key starts without waiting for a sweep to reach its key
    (tests/test_concurrency_keys.py::test_a_job_of_a_free_key_is_pending_once_enqueued). A
    failure is logged: the sweep promotes it later."""

    def promote_key() -> None:

        try:
            promote(Store(connections[alias]), [key], int(clock.now(alias)))
        except DatabaseError:
            logger.warning("could not promote concurrency key %r at enqueue; a worker's sweep will", key)

    transaction.on_commit(promote_key, using=alias)


def _insert(conn: Any, params: list[Any]) -> None:
    """One job's INSERT, on the caller's connection and in its transaction (if any)."""
    cursor = kept_cursor(conn)
    if cursor is None:
        with conn.cursor() as c:
            c.execute(INSERT_SQL, params)
    else:
        cursor.execute(INSERT_SQL, params)


def wake_local_workers(alias: str) -> None:

    if wakeup.listeners:  # a worker runs in this process: wake it when the job commits
        transaction.on_commit(wakeup.notify, using=alias)


def jobs(status: str | None = None, limit: int = 100, *, using: str | None = None) -> list[Job]:
    """Jobs with ``status`` (all when None), highest priority and earliest due first."""
    if status is not None and status not in Status.values:
        raise ValueError(f"status {status!r} is not one of {', '.join(Status.values)}")
    _int("limit", limit, 0, INT64_MAX)
    qs = Job.objects.using(queue_alias(using)).in_queue_order()
    if status is not None:
        qs = qs.filter(status=status)
    return list(qs[:limit])


def failed_jobs(limit: int = 100, *, using: str | None = None) -> list[Job]:
    """The dead-letter list."""
    return jobs(str(Status.FAILED), limit, using=using)
