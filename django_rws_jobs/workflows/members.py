"""A batch's members as enqueue adds them: the member rows and the batch's total, in the
transaction that inserts the jobs (batches.py says what a batch is)."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from ..database.backends import backend_for

#: The batch open in this context, (id, database alias): ``with batch(...)`` sets it, and every
#: job enqueued while it is set joins the batch (batches.py).
open_batch: ContextVar[tuple[str, str] | None] = ContextVar("rws_open_batch", default=None)


class BatchClosed(RuntimeError):
    """A job was enqueued into a batch that is no longer open (cancelled, or sealed)."""


def join(conn: Any, batch_id: str, job_ids: list[str]) -> None:
    """Make ``job_ids`` (inserted in this transaction) members of ``batch_id``: its total first,
    which holds the batch row until the caller commits, so that a seal or a cancel cannot come
    between; BatchClosed if it is no longer open. The caller then calls
    batch_outcomes.cancel_if_failing (a fail_fast batch with a dead member cancels them)."""
    if not job_ids:
        return
    with conn.cursor() as c:
        c.execute(
            "UPDATE rws_batches SET total = total + %s WHERE id = %s AND state = 'open'",
            [len(job_ids), batch_id],
        )
        if c.rowcount != 1:
            raise BatchClosed(f"batch {batch_id} is no longer open: it was sealed or cancelled")
        watched = bool(conn.execute_wrappers) or conn.queries_logged
        backend_for(conn).insert_members(c, batch_id, job_ids, watched)
