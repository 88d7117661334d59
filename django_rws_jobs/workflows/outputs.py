"""Batch members' outputs: what a member's handler passed to ``current_job().record(value)``, kept
in ``rws_batch_outputs`` (a row per member that recorded one) and read by ``Batch.outputs()``.

Invariants (tests/test_batches.py):

- A row is written only while the attempt holds its claim (the job's ``locked_by`` is its token)
  and only for a member, not a callback; the row is replaced by a later record, so what stays is
  the last attempt's.
- It is written through the handler's own connection: inside the handler's transaction it
  commits or rolls back with the rest of the handler's work.
- It is one upsert: the records of members whose transactions are open at once never wait for
  each other, at any isolation level (no DELETE, whose gap lock MariaDB takes at REPEATABLE READ).
- ``read`` pages through one batch's rows by job id, so a batch of any size is never loaded whole.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from django.db import connections, transaction

from ..database import clock
from ..database.backends import backend_for
from ..database.backends.claimed import Claimed

#: Rows ``read`` fetches in one statement.
PAGE = 1000


def keep(alias: str, claim: Claimed, text: str) -> bool:
    """Keep ``text`` as the output of ``claim``'s job if it is a batch member whose claim is still
    held; False otherwise."""
    with transaction.atomic(using=alias), connections[alias].cursor() as c:
        c.execute(
            "SELECT batch_id FROM rws_jobs WHERE id = %s AND locked_by = %s AND status = 'running' "
            "AND batch_id IS NOT NULL AND batch_event IS NULL",
            [claim.id, claim.token],
        )
        row = c.fetchone()
        if row is None:
            return False
        # One upsert, not a DELETE then an INSERT: no gap lock, so that the records of two
        # members' open transactions never wait for each other (nor deadlock) at MariaDB's
        # REPEATABLE READ (tests/test_batches.py::test_records_of_two_members_do_not_wait_for_each_other).
        c.execute(
            *backend_for(connections[alias]).upsert_replacing(
                "rws_batch_outputs",
                ["job_id"],
                ["batch_id", "value", "recorded_at"],
                [[claim.id, row[0], text, int(clock.now(alias))]],
            )
        )
    return True


def read(alias: str, batch_id: str, page: int = PAGE) -> Iterator[tuple[str, Any]]:
    """``(job_id, value)`` of each output of ``batch_id``, in job id order (the order the members
    were enqueued in), ``page`` rows a statement."""
    after = ""
    while True:
        with connections[alias].cursor() as c:
            c.execute(
                "SELECT job_id, value FROM rws_batch_outputs WHERE batch_id = %s AND job_id > %s "
                f"ORDER BY job_id LIMIT {int(page)}",
                [batch_id, after],
            )
            rows = c.fetchall()
        for job_id, value in rows:
            yield job_id, json.loads(value)
        if len(rows) < page:
            return
        after = rows[-1][0]
