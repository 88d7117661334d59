"""A batch's members as enqueue adds them: the member rows and the batch's total, in the
transaction that inserts the jobs (batches.py says what a batch is)."""

from __future__ import annotations

from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

#: The batch open in this context, (id, database alias): ``with batch(...)`` sets it, and every
#: job enqueued while it is set joins the batch (batches.py).
open_batch: ContextVar[tuple[str, str] | None] = ContextVar("rws_open_batch", default=None)


class BatchClosed(RuntimeError):
    """A job was enqueued into a batch that is no longer open (cancelled, or sealed)."""


def member_rows(batch_id: str, job_ids: list[str]) -> Iterator[tuple[str, list[Any]]]:
    """The INSERTs of ``job_ids``' member rows, a few hundred a statement."""
    for start in range(0, len(job_ids), 400):
        part = job_ids[start : start + 400]
        yield (
            "INSERT INTO rws_batch_members (job_id, batch_id) VALUES " + ", ".join(["(%s, %s)"] * len(part)),
            [v for job_id in part for v in (job_id, batch_id)],
        )


def join(conn: Any, batch_id: str, job_ids: list[str]) -> None:
    """Make ``job_ids`` (inserted in this transaction) members of ``batch_id``: its total first,
    which holds the batch row until the caller commits, so that a seal or a cancel cannot come
    between; BatchClosed if it is no longer open."""
    if not job_ids:
        return
    with conn.cursor() as c:
        c.execute(
            "UPDATE rws_batches SET total = total + %s WHERE id = %s AND state = 'open'",
            [len(job_ids), batch_id],
        )
        if c.rowcount != 1:
            raise BatchClosed(f"batch {batch_id} is no longer open: it was sealed or cancelled")
        for sql, params in member_rows(batch_id, job_ids):
            c.execute(sql, params)
