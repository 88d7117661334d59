"""enqueue, enqueue_many, jobs and failed_jobs: rust-web-server's methods, for Django (retry and
delete are in dead_letters.py, tick in worker/tick.py)."""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
from collections.abc import Iterable, Iterator
from typing import Any

from django.db import DatabaseError, IntegrityError, connections, transaction

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
    show,
)
from ..database.validation import concurrency_limit as _concurrency_limit
from ..database.validation import integer as _int
from ..database.validation import only_known as _only_known
from ..database.validation import text as _text
from ..database.validation import timeout as _timeout
from ..flow.concurrency_keys import promote
from ..models import Job, Status
from ..queue import ids, middleware
from ..queue.metadata import metadata_text
from ..queue.registry import registry
from ..queue.store import Store
from ..workflows import dependencies
from ..workflows.batch_outcomes import cancel_if_failing, cancelled_by_dependencies
from ..workflows.members import join, open_batch

logger = logging.getLogger("django_rws_jobs")

#: What a dict item of enqueue_many may hold: enqueue's options, nothing internal.
ITEM_KEYS = (
    "job_type",
    "payload",
    "queue",
    "priority",
    "run_at",
    "run_in",
    "unique",
    "max_retries",
    "timeout",
    "concurrency_key",
    "after",
    "on_dependency_failure",
    "metadata",
)


def unique_hash(job_type: str, unique: str) -> str:
    return hashlib.sha256(f"{job_type}\x00{unique}".encode()).hexdigest()


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
) -> str:
    """Store a job and return its id; inside ``transaction.atomic()`` it commits with the caller.

    With ``unique=key``, while a job of this type and key is pending or running nothing is
    inserted and that job's id is returned (the database enforces it across processes).
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
    deps = _dependencies(after, on_dependency_failure)

    def store(metadata: Any) -> str:
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
        return insert_prepared(alias, params, deps)

    enqueuers = middleware.chains()[0]
    if not enqueuers:
        return store(metadata)
    if metadata is not None:
        metadata_text(metadata)  # a bad one is refused before any middleware sees it
    spec = registry.get(job_type) if isinstance(job_type, str) else None
    named = queue if queue is not None else (spec.options.get("queue", "default") if spec else "default")
    job = middleware.Enqueue(job_type, named, dict(metadata or {}), False, alias)

    def call_next() -> str:
        job.ids = [store(job.metadata or None)]
        return job.ids[0]

    return middleware.enqueue_around(enqueuers, job, call_next)


def _dependencies(after: Any, policy: Any) -> tuple[list[tuple[str, bool]], str] | None:
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


def insert_prepared(
    alias: str, params: list[Any], deps: tuple[list[tuple[str, bool]], str] | None = None
) -> str:
    """Insert one job that ``prepare`` made, in the caller's transaction; return its id (or, for
    a unique job, the id of the live job holding its key). Wakes this process's workers at commit.
    ``deps``: what it waits for and the policy (dependencies.py); it is stored blocked."""
    backend_for(connections[alias]).check_insert_size(params, "the job")
    member_of = _open_batch(alias)
    if deps is not None:
        params[10] = "blocked"
    if member_of is not None or deps is not None:
        # The job, its member row, the batch's total and its dependencies in one transaction.
        params[13] = member_of
        with transaction.atomic(using=alias):
            job_id = _insert_one(alias, params)
            if job_id == params[0]:  # a unique job already live is neither a member nor blocked
                if member_of is not None:
                    join(connections[alias], member_of, [job_id])
                    cancel_if_failing(connections[alias], member_of, [job_id])
                if deps is not None:
                    params[10] = dependencies.add(
                        connections[alias], job_id, *deps, on_cancelled=cancelled_by_dependencies
                    )
    else:
        job_id = _insert_one(alias, params)
    if params[11] is not None and params[4] <= params[5] and params[10] != "blocked":
        _promote_at_commit(alias, params[11])  # a due job with a concurrency key
    _wake_local_workers(alias)
    return job_id


def _insert_one(alias: str, params: list[Any]) -> str:
    if params[-1] is None:
        _insert(connections[alias], params)
        return str(params[0])
    return _insert_unique(alias, params)


def _open_batch(alias: str) -> str | None:
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


def _wake_local_workers(alias: str) -> None:

    if wakeup.listeners:  # a worker runs in this process: wake it when the job commits
        transaction.on_commit(wakeup.notify, using=alias)


def enqueue_many(jobs: Iterable[Any], *, using: str | None = None, batch_size: int = 1000) -> list[str]:
    """Store many jobs at once and return their ids, in order.

    Each item is a job_type string, a ``(job_type, payload)`` pair, a dict of ``enqueue``'s
    arguments (``job_type``, ``payload``, ``queue``, ...), or a django.tasks task with its
    arguments, ``{"task": send_receipt, "args": [42], "kwargs": {}}`` (its id is its result's).
    The rows go in with multi-row inserts (COPY on PostgreSQL), in the caller's transaction, while
    later items are still being validated: an invalid item raises and rolls back everything of the
    call, so that nothing of it is stored. Unique items keep ``enqueue``'s semantics (the id of the
    live job holding the key is returned).
    """
    check_items(jobs)
    _int("batch_size", batch_size, 1, 10_000)
    alias = queue_alias(using)
    return middleware.many(alias, lambda extra: enqueue_items(jobs, alias, batch_size, extra=extra))


def check_items(jobs: Any) -> None:
    if isinstance(jobs, (str, bytes, bytearray, dict)) or not hasattr(jobs, "__iter__"):
        # A str would be taken for its characters, a dict for its keys.
        raise TypeError(f"jobs must be a list of jobs, got {type(jobs).__name__} {show(jobs)}")


def enqueue_items(
    jobs: Iterable[Any], alias: str, batch_size: int, first: int = 0, extra: dict[str, Any] | None = None
) -> list[str]:
    """enqueue_many's work, the items' numbers in errors counted from ``first``; the jobs join the
    batch open in this context, if any. Only the ids and the unique items' rows are kept while
    the rows stream to the database, so a generator of any length takes memory for its ids.
    ``extra``: metadata (a middleware's) stored with each job, under the item's own keys."""
    conn = connections[alias]
    member_of = _open_batch(alias)
    ids: list[str] = []
    uniques: dict[int, list[Any]] = {}  # index: the row of a unique item, inserted after the others
    waits: dict[int, tuple[list[tuple[str, bool]], str]] = {}  # index: what the item waits for
    now = clock.now(alias)

    def plain() -> Iterator[list[Any]]:
        """Validate the items one by one; yield the rows without a unique key."""
        for index, item in enumerate(jobs, first):
            try:
                row, deps = _item_params(item, now)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"job #{index}: {exc}") from None
            row[13] = member_of
            if extra:
                try:
                    row[15] = middleware.merged(row[15], extra)
                except (TypeError, ValueError) as exc:
                    raise type(exc)(f"job #{index}: {exc}") from None
            if deps is not None:
                row[10] = "blocked"
                waits[len(ids)] = deps
            if row[-1] is not None:
                uniques[len(ids)] = row
            ids.append(row[0])
            if row[-1] is None:
                yield row

    def where() -> str:  # the item plain() yielded last
        return f"job #{first + len(ids) - 1}"

    with transaction.atomic(using=alias):
        with conn.cursor() as c:
            # While execute wrappers or the query log watch the connection, every statement goes
            # through the cursor as a str with its parameters, as Django documents
            # (test_enqueue_many_statements_are_seen_by_execute_wrappers_and_the_query_log).
            watched = bool(conn.execute_wrappers) or conn.queries_logged
            backend_for(conn).insert_many(c, plain(), batch_size, where, watched)
        taken = set()  # the unique items that returned another live job's id: neither member nor blocked
        for index, row in uniques.items():
            ids[index] = _insert_unique_checked(conn, alias, row, first + index)
            if ids[index] != row[0]:
                taken.add(index)
        if member_of is not None:
            joined = [job_id for i, job_id in enumerate(ids) if i not in taken] if taken else ids
            join(conn, member_of, joined)
            cancel_if_failing(conn, member_of, joined)
        for index, deps in waits.items():
            if index not in taken:
                try:
                    dependencies.add(conn, ids[index], *deps, on_cancelled=cancelled_by_dependencies)
                except ValueError as exc:  # an id in after= that names nothing
                    raise ValueError(f"job #{first + index}: {exc}") from None
        _wake_local_workers(alias)
    return ids


def _item_params(item: Any, now: float) -> tuple[list[Any], tuple[list[tuple[str, bool]], str] | None]:
    """One enqueue_many item's INSERT parameters, and what it waits for: only enqueue's options,
    by name or as a (job_type, payload) pair.
    (tests/test_input.py::test_enqueue_many_items_take_only_enqueues_options)"""
    if isinstance(item, str):
        return prepare(item, now=now), None
    if isinstance(item, dict) and "task" in item:
        return _task_params(item), None
    if isinstance(item, dict):
        _only_known("key", item, ITEM_KEYS)
        if "job_type" not in item:
            raise TypeError("a dict needs a 'job_type'")
        options = dict(item)
        deps = _dependencies(options.pop("after", None), options.pop("on_dependency_failure", "cancel"))
        return prepare(**options, now=now), deps
    if isinstance(item, (tuple, list)) and 1 <= len(item) <= 2:
        return prepare(*item, now=now), None
    raise TypeError(f"a job must be a job_type, a (job_type, payload) pair or a dict, got {show(item)}")


def _task_params(item: dict[str, Any]) -> list[Any]:
    """A django.tasks item, ``{"task": a_task, "args": [...], "kwargs": {...}}``: the row its
    backend's ``job_params`` makes (an RwsJobsBackend's; tests/test_tasks_backend.py)."""
    _only_known("key", item, ("task", "args", "kwargs"))
    task = item["task"]
    backend = task.get_backend() if callable(getattr(task, "get_backend", None)) else None
    if backend is None or not callable(getattr(backend, "job_params", None)):
        raise TypeError(f"'task' must be a task of an RwsJobsBackend, got {show(task)}")
    return list(backend.job_params(task, item.get("args", ()), item.get("kwargs", {})))


def _insert_unique_checked(conn: Any, alias: str, params: list[Any], index: int) -> str:
    backend_for(conn).check_insert_size(params, f"job #{index}")
    return _insert_unique(alias, params)


def _insert_unique(alias: str, params: list[Any]) -> str:
    conn = connections[alias]
    digest = params[-1]
    # A shared-lock read sees the latest commit even where a plain read sees an older snapshot
    # (MySQL's REPEATABLE READ); it is only the fallback, because it holds the holder's row until
    # the caller commits.
    share = backend_for(conn).features.shared_lock
    lookup = "SELECT id, status FROM rws_jobs WHERE unique_hash = %s"
    for _ in range(10):
        try:
            with transaction.atomic(using=alias), conn.cursor() as c:
                c.execute(INSERT_SQL, params)
            return params[0]
        except IntegrityError:
            pass
        with transaction.atomic(using=alias), conn.cursor() as c:
            c.execute(lookup, [digest])
            row = c.fetchone()
            if row is None and share:
                c.execute(lookup + share, [digest])
                row = c.fetchone()
            if row is not None and row[1] in (Status.PENDING, Status.RUNNING, Status.WAITING):
                return row[0]
            if row is not None:
                # A failed row still holding the key (a rust-web-server writer does not clear it): free it.
                c.execute(
                    "UPDATE rws_jobs SET unique_hash = NULL WHERE id = %s AND status = 'failed'", [row[0]]
                )
        # Otherwise the holder finished between the two statements: insert again.
    raise RuntimeError(f"could not enqueue unique job {params[1]!r} key {params[8]!r}: kept conflicting")


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
