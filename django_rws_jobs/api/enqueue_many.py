"""enqueue_many: many jobs stored at once, validated item by item while the rows stream to the
database in multi-row inserts (COPY on PostgreSQL), in the caller's transaction; each item is
checked and stored as ``enqueue`` (enqueue.py) would store it
(tests/test_enqueue.py, tests/test_input.py)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from django.db import connections, transaction

from ..database import clock
from ..database.backends import backend_for
from ..database.connections import queue_alias
from ..database.validation import integer as _int
from ..database.validation import only_known as _only_known
from ..database.validation import (
    show,
)
from ..queue import middleware
from ..workflows import dependencies
from ..workflows.batch_outcomes import cancel_if_failing, cancelled_by_dependencies
from ..workflows.members import join
from .enqueue import open_batch_id, prepare, waits_for, wake_local_workers
from .enqueue_once import STORED, Enqueued, Once, Skipped, Stored, insert_once, insert_unique, once_options

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
    "on_conflict",
    "max_delay",
    "unique_for",
)


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
    member_of = open_batch_id(alias)
    ids: list[str] = []
    uniques: dict[int, list[Any]] = {}  # index: the row of a unique item, inserted after the others
    onces: dict[int, Once] = {}  # index: a unique item's on_conflict="replace" or unique_for
    waits: dict[int, tuple[list[tuple[str, bool]], str]] = {}  # index: what the item waits for
    now = clock.now(alias)

    def plain() -> Iterator[list[Any]]:
        """Validate the items one by one; yield the rows without a unique key."""
        for index, item in enumerate(jobs, first):
            try:
                row, deps, once = _item_params(item, now)
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
                if once is not None:
                    onces[len(ids)] = once
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
            got = _insert_unique_checked(conn, alias, row, first + index, onces.get(index))
            ids[index] = got
            if got.outcome != STORED:
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
        wake_local_workers(alias)
    return ids


def _item_params(
    item: Any, now: float
) -> tuple[list[Any], tuple[list[tuple[str, bool]], str] | None, Once | None]:
    """One enqueue_many item's INSERT parameters, what it waits for, and what it does when its
    unique key is taken: only enqueue's options, by name or as a (job_type, payload) pair.
    (tests/test_input.py::test_enqueue_many_items_take_only_enqueues_options)"""
    if isinstance(item, str):
        return prepare(item, now=now), None, None
    if isinstance(item, dict) and "task" in item:
        return _task_params(item), None, None
    if isinstance(item, dict):
        _only_known("key", item, ITEM_KEYS)
        if "job_type" not in item:
            raise TypeError("a dict needs a 'job_type'")
        options = dict(item)
        after = options.pop("after", None)
        once = once_options(
            options.get("unique"),
            options.pop("on_conflict", "skip"),
            options.pop("max_delay", None),
            options.pop("unique_for", None),
            after,
        )
        deps = waits_for(after, options.pop("on_dependency_failure", "cancel"))
        return prepare(**options, now=now), deps, once
    if isinstance(item, (tuple, list)) and 1 <= len(item) <= 2:
        return prepare(*item, now=now), None, None
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


def _insert_unique_checked(
    conn: Any, alias: str, params: list[Any], index: int, once: Once | None
) -> Enqueued:
    backend_for(conn).check_insert_size(params, f"job #{index}")
    if once is not None:
        return insert_once(alias, params, once)
    job_id = insert_unique(alias, params)
    return Stored(job_id) if job_id == params[0] else Skipped(job_id)
