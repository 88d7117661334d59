"""Cancelling jobs: ``cancel(job_id)``.

A pending or waiting job becomes ``cancelled`` at once, in one statement, and no claim reads it
again. A running job is asked: ``cancel_requested_at`` is set on its row and its unique key freed
in the same statement, and the worker that holds it sees the request (worker/cancels.py) and
stops the handler; whatever then ends the claim (the stopped handler, a failure, a hand-back,
recovery of an expired lease) writes ``cancelled`` instead of putting the job back, because every
statement that puts a held job back applies only while no cancel was requested (Store.fenced's
``cancel_requested``), and Store.cancel_running applies only when one was. A handler that
succeeds first deletes its row as always: the job stays done. Pinned by tests/test_cancel.py.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import connections, transaction

from ..database import clock
from ..database.backends.claimed import Claimed
from ..database.connections import queue_alias
from ..database.validation import job_id as _job_id
from ..database.validation import text as _text
from ..exceptions import cancel_message
from ..flow.concurrency_keys import promote
from ..models import Job, Status
from ..queue.store import Store
from ..signals import send_cancelled
from ..workflows.batch_outcomes import settle

logger = logging.getLogger("django_rws_jobs")

#: Cancelled rows a worker prunes in one statement.
PRUNE_BATCH = 1000


def cancel(job_id: str, *, by: str | None = None, using: str | None = None) -> bool:
    """Cancel a pending, waiting, blocked or running job; False when no such job has that id.

    ``by`` (who asked; the admin passes the user) is kept on the row with the time. A running
    job's worker stops its handler within about a second and records it cancelled; it is never
    retried. Send ``job_cancelled`` once the job is cancelled (a running one: by its worker)."""
    job_id = _job_id(job_id)
    if by is not None:
        by = _text("by", by, limit=191)
    alias = queue_alias(using)
    now = int(clock.now(alias))
    jobs = Job.objects.using(alias).filter(id=job_id)
    with transaction.atomic(using=alias):
        waiting = list(
            jobs.filter(status__in=(Status.PENDING, Status.WAITING, Status.BLOCKED)).select_for_update()
        )
        error = cancel_message(by, running=False)
        # The UPDATE keeps the status condition: a claim that took the job meanwhile (where rows
        # are not locked by the SELECT) leaves it to the running job's branch below.
        if waiting and jobs.filter(status__in=(Status.PENDING, Status.WAITING, Status.BLOCKED)).update(
            status=Status.CANCELLED,
            cancelled_at=now,
            cancelled_by=by,
            last_error=error,
            unique_hash=None,
            concurrency_slot=None,
        ):
            job = waiting[0]
            job.status, job.cancelled_at, job.cancelled_by, job.last_error = Status.CANCELLED, now, by, error
            key = job.concurrency_key if job.concurrency_slot is not None else None
            transaction.on_commit(lambda: _after_cancel(job, key, alias), using=alias)
            return True
        # The request frees the job's unique key at once: the next enqueue of the key makes a new
        # job, which runs, whatever the stopping one still does
        # (tests/test_cancel.py::test_a_cancel_request_frees_the_unique_key_of_a_running_job).
        asked = jobs.filter(status=Status.RUNNING, cancel_requested_at__isnull=True).update(
            cancel_requested_at=now, cancelled_by=by, unique_hash=None
        )
        return bool(asked) or jobs.filter(status=Status.RUNNING).exists()


def _after_cancel(job: Job, freed_key: str | None, alias: str) -> None:
    """A pending job that held its key's slot frees it for the key's next job, then job_cancelled.

    The cancel has committed: a promotion that fails is logged and left to the workers' key sweep,
    and cancel() still returns True and sends the signal
    (tests/test_cancel.py::test_a_cancel_whose_promotion_fails_still_returns_true_and_signals)."""
    if freed_key is not None:
        try:
            promote(Store(connections[alias]), [freed_key], int(clock.now(alias)))
        except Exception:
            logger.exception(
                "job %s (%s) cancelled; the promotion of the next job of its concurrency key %r "
                "failed: a worker's key sweep promotes it",
                job.id,
                job.job_type,
                freed_key,
            )
    _settle(job, alias)
    send_cancelled(job)


def _settle(job: Job, alias: str) -> None:
    """A job cancelled before it ran: what waits for it, its batch member row and its batch's
    finish; one that fails is logged and left to the workers' sweeps (batch_upkeep.py,
    dependencies.py)."""

    try:
        settle(
            Store(connections[alias]),
            [(Claimed.stand_in(job.id, job.batch_id), "cancelled")],
            int(clock.now(alias)),
        )
    except Exception:
        logger.exception(
            "job %s cancelled; resolving what it belongs to failed: a worker's sweep will", job.id
        )


def prune_cancelled(store: Any, now: int, retention: float) -> int:
    """Delete up to PRUNE_BATCH cancelled jobs cancelled more than ``retention`` seconds ago."""
    with store.writes, store.cursor() as c:
        c.execute(
            "SELECT id FROM rws_jobs WHERE status = 'cancelled' AND cancelled_at < %s "
            f"ORDER BY cancelled_at LIMIT {PRUNE_BATCH}",
            [now - retention],
        )
        ids = [row[0] for row in c.fetchall()]
        if not ids:
            return 0
        marks = ", ".join(["%s"] * len(ids))
        c.execute(f"DELETE FROM rws_jobs WHERE id IN ({marks}) AND status = 'cancelled'", ids)
        return c.rowcount
