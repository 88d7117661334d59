"""The keeper's repairs of batches: what a crash or a writer that does not know batches left
(``sweep``, ``sweep_dependencies``), and finished batches' rows deleted after their retention
(``prune``). They reconcile from the jobs' rows, which are the truth, with the same set
operations a worker's outcome uses (batch_outcomes.py), so that a repair written twice changes
nothing (tests/test_batches.py::test_the_sweep_finishes_what_a_crash_left, the prune tests).
"""

from __future__ import annotations

import logging
from typing import Any

from ..database.backends.claimed import Claimed
from ..database.backends.inserts import batches
from ..database.backends.statements import placeholders
from . import dependency_outcomes
from .batch_outcomes import CHUNK, cancelled_by_dependencies, finish_each, reopen_members, settle

logger = logging.getLogger("django_rws_jobs")

#: Member rows the sweep looks at in one statement.
SWEEP_LIMIT = 500


def sweep(store: Any, now: int, limit: int = SWEEP_LIMIT) -> int:
    """Repair what a crash left, from the jobs' rows: members whose job ended without it being
    written (a worker killed between its two commits, a rust-web-server worker's outcome), members
    put back in the queue by a writer that does not know batches, and sealed batches with nothing
    outstanding. Returns how many batches it finished."""
    with store.cursor() as c:
        c.execute(
            "SELECT m.job_id, m.batch_id, j.status FROM rws_batch_members m LEFT JOIN rws_jobs j "
            "ON j.id = m.job_id WHERE m.outcome IS NULL "
            "AND (j.id IS NULL OR j.status IN ('failed', 'cancelled')) "
            f"LIMIT {int(limit)}",
        )
        ended = c.fetchall()
        c.execute(
            "SELECT m.job_id FROM rws_batch_members m JOIN rws_jobs j ON j.id = m.job_id "
            "WHERE m.outcome IS NOT NULL AND j.status IN ('pending', 'waiting', 'running') "
            f"LIMIT {int(limit)}"
        )
        back = [row[0] for row in c.fetchall()]
    if back:
        with store.writes, store.atomic():
            reopen_members(store, back)
    if ended:
        as_result = {None: "done", "failed": "dead", "cancelled": "cancelled"}
        pairs = [
            (Claimed.stand_in(job_id, batch_id), as_result[status]) for job_id, batch_id, status in ended
        ]
        logger.warning("batches: %d member outcome(s) found unrecorded; recorded now", len(pairs))
        finished = settle(store, pairs, now)
    else:
        finished = 0
    with store.cursor() as c:
        c.execute(
            "SELECT b.id FROM rws_batches b WHERE b.state = 'sealed' AND NOT EXISTS (SELECT 1 FROM "
            "rws_batch_members m WHERE m.batch_id = b.id AND m.outcome IS NULL) "
            f"LIMIT {int(limit)}"
        )
        idle = [row[0] for row in c.fetchall()]
    return finished + finish_each(store, ((batch_id, True) for batch_id in idle), now)


#: Batches pruned in one pass.
PRUNE_BATCH = 100
#: Member and output rows deleted in one pass: a batch's rows go over as many passes as they
#: take, and its own row with the last of them.
PRUNE_ROWS = 5000


def prune(store: Any, now: int, retention: float) -> int:
    """Delete up to PRUNE_BATCH batches that finished or were cancelled more than ``retention``
    seconds ago, with their member rows and outputs, at most PRUNE_ROWS of those a pass (the
    members' job rows stay). Returns how many batches it deleted."""
    with store.cursor() as c:
        c.execute(
            "SELECT id FROM rws_batches WHERE state IN ('finished', 'cancelled') AND finished_at < %s "
            f"ORDER BY finished_at LIMIT {PRUNE_BATCH}",
            [now - retention],
        )
        old = [row[0] for row in c.fetchall()]
    if not old:
        return 0
    budget = PRUNE_ROWS
    for table in ("rws_batch_outputs", "rws_batch_members"):
        with store.cursor() as c:
            c.execute(
                f"SELECT job_id FROM {table} WHERE batch_id IN ({placeholders(len(old))}) LIMIT {budget + 1}",
                old,
            )
            rows = [row[0] for row in c.fetchall()]
        with store.writes, store.atomic(), store.cursor() as c:
            for part in batches(iter(rows[:budget]), CHUNK):
                c.execute(
                    f"DELETE FROM {table} WHERE job_id IN ({placeholders(len(part))}) AND EXISTS "
                    f"(SELECT 1 FROM rws_batches b WHERE b.id = {table}.batch_id "
                    "AND b.state IN ('finished', 'cancelled'))",
                    list(part),
                )
        if len(rows) > budget:
            return 0  # more of these batches' rows than a pass deletes: the next pass goes on
        budget -= len(rows)
        if budget <= 0:
            return 0
    with store.writes, store.atomic(), store.cursor() as c:
        marks = placeholders(len(old))
        c.execute(
            f"DELETE FROM rws_batches WHERE id IN ({marks}) AND state IN ('finished', 'cancelled')",
            old,
        )
        return int(c.rowcount)


def sweep_dependencies(store: Any, now: int) -> int:
    """The keeper's ``dependency_outcomes.sweep``, with what it cancels recorded in their batches and
    signalled (tests/test_batches.py::test_what_the_dependency_sweep_cancels_finishes_its_batch)."""
    cancelled: list[str] = []
    changed = dependency_outcomes.sweep(store, now, cancelled=cancelled)
    if cancelled:
        cancelled_by_dependencies(store, cancelled)
    return changed
