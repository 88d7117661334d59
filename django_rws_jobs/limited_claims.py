"""The claim of a queue with limits (RWS_JOBS["QUEUES"]): one short transaction under the lock of
the queue's ``rws_queues`` row.

Invariant: the claims of one limited queue run one at a time (the row lock; SQLite's write lock),
and each counts the queue's running jobs from the job rows themselves, so a slot is held exactly
while a job of the queue is running: every way out of running (success, failure, retry, hand back,
time limit, the dead-letter list, recovery of an expired lease) frees it once, by changing the row,
and nothing can leak or be freed twice
(tests/test_limits.py::test_the_bookkeeping_matches_a_model_whatever_the_interleaving). A rate
limit counts the claims of the current window (the queue's clock, windows of its period aligned to
the unix epoch) in the same row.
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError

from .backends.claimed import CLAIM_COLUMNS, Claimed, claim_order_key
from .backends.statements import CLAIM_SET, placeholders
from .limits import QueueLimits

DUE = "status = 'pending' AND queue = %s AND next_run_at <= %s"
ORDER = "priority DESC, next_run_at, created_at, id"


def claim_limited(
    store: Any, queue: str, limits: QueueLimits, token: str, now: int, lease_until: int, want: int
) -> tuple[list[Claimed], bool]:
    """Claim up to ``want`` due jobs of ``queue`` within its limits. Returns the jobs claimed and
    whether due jobs were left for the limits (a ``--burst`` worker waits for them)."""
    try:
        with store.writes, store.atomic(), store.cursor() as c:
            return _claim(c, store.features.row_lock, queue, limits, token, now, lease_until, want)
    except IntegrityError:  # another process inserted the queue's row meanwhile: next round
        return [], True


def claim_limited_queues(
    store: Any,
    queues: list[str],
    limits: dict[str, QueueLimits],
    token: str,
    now: int,
    lease_until: int,
    want: int,
) -> tuple[list[Claimed], bool]:
    """claim_limited for each of ``queues`` in turn until ``want`` jobs are claimed, each in its
    own transaction. Returns the jobs and whether any queue left due jobs for its limits."""
    claimed: list[Claimed] = []
    held_back = False
    for queue in queues:
        if len(claimed) >= want:
            break
        got, left = claim_limited(store, queue, limits[queue], token, now, lease_until, want - len(claimed))
        claimed += got
        held_back = held_back or left
    return claimed, held_back


def _claim(
    c: Any, row_lock: str, queue: str, limits: QueueLimits, token: str, now: int, lease_until: int, want: int
) -> tuple[list[Claimed], bool]:
    # The queue's row, locked (SQLite: the transaction holds the write lock). A claim that takes
    # nothing writes nothing, so it wakes no idle SQLite worker (PRAGMA data_version).
    c.execute(f"SELECT window_start, window_claims FROM rws_queues WHERE name = %s{row_lock}", [queue])
    row = c.fetchone()
    if row is None:
        c.execute("INSERT INTO rws_queues (name, paused, window_claims) VALUES (%s, %s, 0)", [queue, False])
        row = (None, 0)
    window_start, window_claims = row
    allowed = want
    if limits.concurrency is not None:
        c.execute("SELECT COUNT(*) FROM rws_jobs WHERE status = 'running' AND queue = %s", [queue])
        allowed = min(allowed, limits.concurrency - c.fetchone()[0])
    # A window never moves back: a claim whose ``now`` lies in an earlier window than the row's
    # (read before it waited for the lock, or a host whose clock is behind) counts in the row's
    # (tests/test_limits.py::test_a_claim_handed_an_earlier_now_does_not_start_the_count_again).
    window = now - now % limits.period
    if window_start is None or window > window_start:
        window_start, window_claims = window, 0
    if limits.rate is not None:
        allowed = min(allowed, limits.rate - window_claims)
    if allowed <= 0:
        c.execute(f"SELECT 1 FROM rws_jobs WHERE {DUE} LIMIT 1", [queue, now])
        return [], c.fetchone() is not None
    c.execute(f"SELECT id FROM rws_jobs WHERE {DUE} ORDER BY {ORDER} LIMIT {allowed + 1}", [queue, now])
    ids = [row[0] for row in c.fetchall()]
    left = len(ids) > allowed
    ids = ids[:allowed]
    if not ids:
        return [], False
    marks = placeholders(len(ids))
    c.execute(
        f"UPDATE rws_jobs SET {CLAIM_SET} WHERE id IN ({marks}) AND status = 'pending'",
        [token, lease_until, now, *ids],
    )
    c.execute(f"SELECT {CLAIM_COLUMNS} FROM rws_jobs WHERE id IN ({marks}) AND locked_by = %s", [*ids, token])
    claimed = sorted((Claimed.from_row(row, token) for row in c.fetchall()), key=claim_order_key)
    c.execute(
        "UPDATE rws_queues SET window_start = %s, window_claims = %s WHERE name = %s",
        [window_start, window_claims + len(claimed), queue],
    )
    return claimed, left
