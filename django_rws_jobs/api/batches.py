"""Batches: ``batch()``, ``call()`` and ``get_batch()``.

A batch is a set of jobs (its members) and the callbacks enqueued when every member has ended:
``on_finish`` always, ``on_success`` when every member succeeded, else ``on_failure``. Inside
``with batch(...) as b:`` the batch is open and every job enqueued in the block (``b.enqueue``,
``b.enqueue_many``, plain ``enqueue``/``enqueue_many``, a ``django.tasks`` task's ``.enqueue()``)
joins it: each job, its member row and the batch's ``total`` go in one transaction (api.py).
Members commit as any enqueue does and may run while the block is open; leaving the block seals
the batch, and only a sealed batch finishes. An exception in the block cancels the batch and its
members that have not ended, blocked ones included. How the finish stays once per finish through
crashes: batch_outcomes.py and batch_upkeep.py.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

from django.db import connections, transaction
from django.db.models import Count, QuerySet

from ..database import clock
from ..database.connections import queue_alias
from ..database.validation import integer as _int
from ..database.validation import job_id as _job_id
from ..database.validation import only_known as _only_known
from ..database.validation import show
from ..database.validation import text as _text
from ..exceptions import cancel_message
from ..models import BatchMember, BatchRecord, BatchState, Job
from ..queue import ids, middleware
from ..queue.metadata import metadata_text
from ..queue.store import Store
from ..workflows import outputs
from ..workflows.batch_outcomes import FAIL_FAST_BY, after_cancel, cancel_outstanding, try_finish
from ..workflows.members import BatchClosed, open_batch
from .dead_letters import retry, retry_many
from .enqueue import enqueue, prepare
from .enqueue_many import check_items, enqueue_items

logger = logging.getLogger("django_rws_jobs")

#: The enqueue options a job_type's callback takes (``unique`` is not one: a callback is
#: enqueued once per finish already).
CALL_OPTIONS = ("queue", "priority", "run_in", "max_retries", "timeout", "concurrency_key", "metadata")
EVENTS = ("success", "failure", "finish")


@dataclasses.dataclass(frozen=True)
class Call:
    """A callback: a job's INSERT parameters as ``api.prepare`` made them; ``call()`` makes it."""

    row: tuple[Any, ...]

    @property
    def job_type(self) -> str:
        return str(self.row[1])

    def __repr__(self) -> str:
        return f"call({self.job_type!r})"


def call(target: Any, *args: Any, **options: Any) -> Call:
    """A callback for ``batch(on_success=, on_failure=, on_finish=)``: a job_type with its payload
    and enqueue options (``call("reports.build", "7", queue="reports")``), or a ``django.tasks``
    task with its arguments (``call(build_report, import_id=7)``). Checked now, as ``enqueue``
    checks; enqueued when the batch finishes."""

    if isinstance(target, str):
        if len(args) > 1:
            raise TypeError(f"call({target!r}, ...) takes one payload, got {len(args)} positional arguments")
        if "unique" in options:
            raise TypeError("call() takes no 'unique': a callback is enqueued once per finish of its batch")
        _only_known("option", {k: None for k in options if k != "payload"}, CALL_OPTIONS)
        payload = args[0] if args else options.pop("payload", "")
        row = prepare(target, payload, **options)
    elif callable(getattr(target, "get_backend", None)):
        backend = target.get_backend()
        if not callable(getattr(backend, "job_params", None)):
            raise TypeError(f"call() takes a task of an RwsJobsBackend, got {show(target)}")
        row = list(backend.job_params(target, args, options))
        row[8] = row[-1] = None  # a unique task's key: the finish enqueues its callback once
    else:
        raise TypeError(f"call() takes a job_type (str) or a django.tasks task, got {show(target)}")
    return Call(tuple(row))


def _callbacks(event: str, value: Any) -> list[list[Any]]:
    if value is None:
        return []
    calls = [value] if isinstance(value, Call) else value
    if not isinstance(calls, (list, tuple)) or not calls or not all(isinstance(c, Call) for c in calls):
        raise TypeError(f"on_{event} must be a call(...) or a list of them, got {show(value)}")
    return [list(c.row) for c in calls]


class batch:  # noqa: N801  (a context manager used as a function: ``with batch(...) as b``)
    """``with batch(on_success=call(...), ...) as b:``: see the module's docstring."""

    #: What ``enqueue(after=[...])`` takes for a batch (dependencies.targets).
    is_rws_batch = True

    def __init__(
        self,
        *,
        on_success: Any = None,
        on_failure: Any = None,
        on_finish: Any = None,
        description: str = "",
        metadata: dict[str, Any] | None = None,
        fail_fast: bool = False,
        using: str | None = None,
    ):
        self.callbacks = {
            event: rows
            for event, value in (("success", on_success), ("failure", on_failure), ("finish", on_finish))
            if (rows := _callbacks(event, value))
        }
        self.description = _text("description", description, limit=10_000, empty=True)
        self.metadata = metadata_text(metadata)
        if not isinstance(fail_fast, bool):
            raise TypeError(f"fail_fast must be True or False, got {show(fail_fast)}")
        self.fail_fast = fail_fast
        self.alias = queue_alias(using)
        self.id = ids.new_id()
        self._token: Any = None

    def __enter__(self) -> batch:
        outer = open_batch.get()
        if outer is not None:
            raise RuntimeError(f"batch {outer[0]} is open here already: batches do not nest")
        BatchRecord.objects.using(self.alias).create(
            id=self.id,
            description=self.description,
            metadata=self.metadata,
            callbacks=json.dumps(self.callbacks),
            fail_fast=self.fail_fast,
            created_at=int(clock.now(self.alias)),
        )
        self._token = open_batch.set((self.id, self.alias))
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        open_batch.reset(self._token)
        self._token = None
        if exc_type is not None:
            _cancel(self.alias, self.id, f"cancelled: its batch's block raised {exc_type.__name__}")
            return
        now = int(clock.now(self.alias))
        BatchRecord.objects.using(self.alias).filter(id=self.id, state=BatchState.OPEN).update(
            state=BatchState.SEALED, sealed_at=now
        )
        # Members may all have ended while the block ran: finish now (after the caller commits).
        transaction.on_commit(lambda: _finish_now(self.alias, self.id), using=self.alias)

    def _inside(self) -> None:
        if open_batch.get() != (self.id, self.alias):
            raise BatchClosed(f"batch {self.id} takes jobs only inside its with block")

    def enqueue(self, job_type: str, payload: str = "", **options: Any) -> str:
        """``enqueue`` into this batch (inside its block)."""

        self._inside()
        options.setdefault("using", self.alias)
        return enqueue(job_type, payload, **options)

    def enqueue_many(self, jobs: Iterable[Any], *, batch_size: int = 1000) -> list[str]:
        """``enqueue_many`` into this batch (inside its block): the rows stream to the database
        in one transaction, ``batch_size`` a statement, and only their ids are held, so that a
        generator of any length takes memory for its ids alone; the ids in order."""

        self._inside()
        check_items(jobs)
        _int("batch_size", batch_size, 1, 10_000)
        return middleware.many(
            self.alias, lambda extra: enqueue_items(jobs, self.alias, batch_size, extra=extra)
        )


def _finish_now(alias: str, batch_id: str) -> None:

    try_finish(Store(connections[alias]), batch_id, int(clock.now(alias)), check_fail_fast=True)


def _cancel(alias: str, batch_id: str, error: str, by: str | None = None) -> bool:
    """Cancel the batch and its members that have not ended (blocked ones too); once that
    commits, resolve what waits for them and for the batch, and send job_cancelled for each
    (tests/test_batches.py::test_a_cancel_also_cancels_blocked_members)."""

    now = int(clock.now(alias))
    cancelled: list[str] = []
    with transaction.atomic(using=alias):
        changed = (
            BatchRecord.objects.using(alias)
            .filter(id=batch_id, state__in=(BatchState.OPEN, BatchState.SEALED))
            .update(state=BatchState.CANCELLED, finished_at=now)
        )
        if changed:
            cancelled = cancel_outstanding(Store(connections[alias]), batch_id, now, error, by)
    if changed:
        transaction.on_commit(lambda: _after_cancel(alias, batch_id, cancelled, now), using=alias)
    return bool(changed)


def _after_cancel(alias: str, batch_id: str, cancelled: list[str], now: int) -> None:
    """The cancel committed: a failure here is logged and left to the workers' sweeps."""

    try:
        after_cancel(Store(connections[alias]), batch_id, cancelled, now)
    except Exception:
        logger.exception("batch %s cancelled; resolving what waits for it failed: the sweeps will", batch_id)


@dataclasses.dataclass
class Batch:
    """A batch as ``get_batch`` read it. Counts: ``total`` members, of which ``succeeded``,
    ``failed`` (dead), ``cancelled`` and ``pending`` (not yet ended). Times in unix seconds."""

    id: str
    description: str
    metadata: dict[str, Any]
    state: str
    outcome: str | None
    fail_fast: bool
    total: int
    succeeded: int
    failed: int
    cancelled: int
    pending: int
    created_at: int
    sealed_at: int | None
    finished_at: int | None
    callbacks: dict[str, list[str]]
    using: str

    #: What ``enqueue(after=[...])`` takes for a batch (dependencies.targets).
    is_rws_batch: ClassVar[bool] = True

    def cancel(self, *, by: str | None = None) -> bool:
        """Cancel an open or sealed batch: its pending members at once, running ones asked to
        stop; no callback fires. False if it had finished or was cancelled already."""
        if by is not None:
            by = _text("by", by, limit=191)
        return _cancel(
            self.using, self.id, cancel_message(by, running=False) + " (its batch was cancelled)", by
        )

    def retry_failed(self) -> int:
        """Put the members that died back in the queue, and in a ``fail_fast`` batch the members
        its fail_fast cancelled; the batch finishes again once they end (``on_success`` then, if
        they all succeed). Returns how many were put back
        (tests/test_batches.py::test_retry_failed_on_a_fail_fast_batch_puts_back_what_it_cancelled)."""

        members = BatchMember.objects.using(self.using).filter(batch_id=self.id)
        # One commit for all: a member put back cannot end the batch before its siblings are back.
        with transaction.atomic(using=self.using):
            failed = list(members.filter(outcome="failed").values_list("job_id", flat=True))
            retried, _ = retry_many(failed, using=self.using)
            put_back = len(retried)
            if self.fail_fast:
                for job_id in (
                    Job.objects.using(self.using)
                    .filter(
                        id__in=members.filter(outcome="cancelled").values("job_id"),
                        status="cancelled",
                        cancelled_by=FAIL_FAST_BY,
                    )
                    .values_list("id", flat=True)
                ):
                    put_back += retry(job_id, using=self.using)
        return put_back

    def failed_jobs(self) -> QuerySet[Job]:
        """The members that died (in the dead-letter list), as a queryset."""
        dead = BatchMember.objects.using(self.using).filter(batch_id=self.id, outcome="failed")
        return Job.objects.using(self.using).filter(id__in=dead.values("job_id"))

    def outputs(self) -> Iterator[tuple[str, Any]]:
        """``(job_id, value)`` for each member that kept an output with
        ``current_job().record(value)``, in the order the members were enqueued; read a page at a
        time as it is iterated, never loaded whole."""
        return outputs.read(self.using, self.id)

    def jobs(self) -> QuerySet[Job]:
        """The members that have not succeeded (their rows), as a queryset."""
        left = BatchMember.objects.using(self.using).filter(batch_id=self.id)
        return Job.objects.using(self.using).filter(id__in=left.values("job_id"))

    def refresh(self) -> Batch:
        fresh = get_batch(self.id, using=self.using)
        assert fresh is not None
        return fresh


def get_batch(batch_id: str, *, using: str | None = None) -> Batch | None:
    """The batch ``batch_id`` with its counts, or None."""
    batch_id = _job_id(batch_id)
    alias = queue_alias(using)
    row = BatchRecord.objects.using(alias).filter(id=batch_id).first()
    if row is None:
        return None
    counts = {None: 0, "failed": 0, "cancelled": 0}
    for outcome, n in (
        BatchMember.objects.using(alias)
        .filter(batch_id=batch_id)
        .values_list("outcome")
        .annotate(n=_count())
        .order_by()
    ):
        counts[outcome] = n
    left = sum(counts.values())
    stored = json.loads(row.callbacks or "{}")
    return Batch(
        id=row.id,
        description=row.description,
        metadata=json.loads(row.metadata) if row.metadata else {},
        state=row.state,
        outcome=row.outcome,
        fail_fast=row.fail_fast,
        total=row.total,
        succeeded=max(row.total - left, 0),
        failed=counts["failed"],
        cancelled=counts["cancelled"],
        pending=counts[None],
        created_at=row.created_at,
        sealed_at=row.sealed_at,
        finished_at=row.finished_at,
        callbacks={event: [r[1] for r in rows] for event, rows in stored.items()},
        using=alias,
    )


def _count() -> Any:

    return Count("job_id")


__all__ = ["Batch", "BatchClosed", "Call", "batch", "call", "get_batch"]
