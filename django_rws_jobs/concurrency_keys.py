"""Per-key concurrency (``enqueue(concurrency_key=)``): the promotion of waiting jobs into the
slots of their key.

A job with a key is enqueued waiting, and every way a job goes back to the queue (a retry, a hand
back, recovery, an operator's retry) makes it waiting again, its slot freed by the same statement
(store.BACK_IN_QUEUE). Only the promotion below makes a waiting job pending, and it gives the job
a slot: a number below the job's limit that no other job of the key holds.

Invariant: every pending or running job with a key holds a slot, and no two jobs of one key hold
the same slot (the unique constraint rws_jobs_key_slot_unique, which the database checks however
many processes promote at once), so at most ``limit`` jobs of a key are pending or running. A slot
is a column of the job's own row, cleared by the statement that takes the job out of running or
deletes its row: it can be neither leaked nor freed twice
(tests/test_concurrency_keys.py::test_the_slots_match_a_model_whatever_the_interleaving).

Who promotes: the worker that freed a slot, right after (completer, dispatcher, recovery, hand
back), and every worker's sweep, at most REFRESH seconds apart, for what nobody freed (jobs just
enqueued, retries that became due, a slot freed by a rust-web-server worker or a deletion).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from typing import Any

from django.db import IntegrityError, transaction

from .backends.base import is_registered

SLOTS = "SELECT concurrency_slot FROM rws_jobs WHERE concurrency_key = %s AND concurrency_slot IS NOT NULL"
#: Jobs of one key promoted at most in one go; the rest at the next promotion.
BATCH = 64
CANDIDATES = (
    "SELECT id, concurrency_limit FROM rws_jobs WHERE status = 'waiting' AND concurrency_key = %s "
    f"AND next_run_at <= %s ORDER BY priority DESC, next_run_at, created_at, id LIMIT {BATCH}"
)
PROMOTE = "UPDATE rws_jobs SET status = 'pending', concurrency_slot = %s WHERE id = %s AND status = 'waiting'"
#: Tries per key when another process took a slot between this one's read and its write.
TRIES = 3


def promote(store: Any, keys: Iterable[str], now: int, *, in_transaction: bool = False) -> int:
    """Make due waiting jobs of ``keys`` pending while their key has a free slot, in claim order;
    return how many. ``in_transaction``: the caller holds a transaction on ``store`` (SQLite's
    claim, whose write lock keeps every other writer out)."""
    total = 0
    for key in sorted(set(keys)):
        for _ in range(TRIES):
            got, conflicted = _promote_key(store, key, now, in_transaction)
            total += got
            if not conflicted:
                break
    if total and store.features.wakeup == "listen":
        with store.cursor() as c:  # wake the idle workers of other processes (PostgreSQL)
            c.execute("SELECT pg_notify('rws_jobs', '')")
    return total


def _promote_key(store: Any, key: str, now: int, in_transaction: bool) -> tuple[int, bool]:
    if store.features.serializes_writes and not in_transaction:
        # SQLite: reads and writes in one write transaction, so no other process promotes
        # between them (and one commit for the key).
        with store.writes, store.atomic():
            return _promote_in(store, key, now)
    with store.writes:
        return _promote_in(store, key, now)


def _promote_in(store: Any, key: str, now: int) -> tuple[int, bool]:
    """Returns the jobs promoted and whether a slot was taken by another process meanwhile."""
    with store.cursor() as c:
        c.execute(SLOTS, [key])
        taken = {row[0] for row in c.fetchall()}
        c.execute(CANDIDATES, [key, now])
        got = 0
        for job_id, limit in c.fetchall():
            limit = limit or 1
            if len(taken) >= limit:
                continue  # (a job of another type may share the key with a larger limit)
            slot = next(s for s in range(limit) if s not in taken)
            try:
                changed = _take(store, c, slot, job_id)
            except (IntegrityError, store.conn.Database.IntegrityError):
                # The driver's own error on a worker's connection (DriverCursor translates it
                # only when its block exits), Django's on a registered one.
                return got, True
            if changed:
                taken.add(slot)
                got += 1
        return got, False


def _take(store: Any, c: Any, slot: int, job_id: str) -> bool:
    """Give ``job_id`` the slot ``slot``; IntegrityError when another job of its key holds it."""
    conn = store.conn
    if is_registered(conn) and conn.in_atomic_block:
        # A savepoint: a conflict leaves the caller's transaction usable (tick() inside one).
        with transaction.atomic(using=conn.alias):
            c.execute(PROMOTE, [slot, job_id])
            return c.rowcount == 1
    c.execute(PROMOTE, [slot, job_id])
    return c.rowcount == 1


class KeySweep:
    """A worker's sweep: the keys that have due waiting jobs, KEYS_PER_SWEEP at a time in key
    order, from where the last one stopped, each promoted."""

    #: The longest time (seconds) between two sweeps of a busy worker.
    REFRESH = 1.0
    KEYS_PER_SWEEP = 100

    def __init__(self) -> None:
        self.after = ""
        self.swept_at = -math.inf
        #: The last sweep found due waiting jobs (a ``--burst`` worker waits for their keys).
        self.waiting = False

    def stale(self) -> bool:
        return time.monotonic() - self.swept_at >= self.REFRESH

    def sweep(self, store: Any, now: int) -> int:
        n = self.KEYS_PER_SWEEP
        with store.cursor() as c:
            c.execute(
                "SELECT DISTINCT concurrency_key FROM rws_jobs WHERE status = 'waiting' "
                f"AND next_run_at <= %s AND concurrency_key > %s ORDER BY concurrency_key LIMIT {n}",
                [now, self.after],
            )
            keys = [row[0] for row in c.fetchall()]
        self.after = keys[-1] if len(keys) == n else ""
        self.swept_at = time.monotonic()
        self.waiting = bool(keys)
        return promote(store, keys, now) if keys else 0


def keys_of(jobs: Iterable[Any]) -> list[str]:
    """The concurrency keys of ``jobs`` (Claimed), those without one left out."""
    return [job.concurrency_key for job in jobs if job.concurrency_key is not None]
