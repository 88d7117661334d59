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

from ..database.backends.base import is_registered

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
    order, from where the last one stopped; those with a free slot are promoted. A key whose
    slots are all held costs the sweep one index entry, not a promotion's statements, so a
    sweep walks many busy keys cheaply (benchmarks/keys.py)."""

    #: The longest time (seconds) between two sweeps of a busy worker.
    REFRESH = 1.0
    KEYS_PER_SWEEP = 1000

    def __init__(self) -> None:
        self.after = ""
        self.swept_at = -math.inf
        #: The last sweep found due waiting jobs.
        self.waiting = False

    def stale(self) -> bool:
        return time.monotonic() - self.swept_at >= self.REFRESH

    def sweep(self, store: Any, now: int) -> int:
        """One page of keys from the cursor (the first page again once past the last key);
        return the jobs promoted."""
        keys, full_page = self._page(store, now, self.after)
        if not keys and self.after:  # past the last key: start again from the first
            keys, full_page = self._page(store, now, "")
        self.after = keys[-1][0] if full_page else ""
        self.swept_at = time.monotonic()
        self.waiting = bool(keys)
        free = [key for key, has_room in keys if has_room]
        return promote(store, free, now) if free else 0

    def sweep_all(self, store: Any, now: int) -> int:
        """Every key, page after page (tick(), and a --burst worker before it decides to stop:
        tests/test_concurrency_keys.py::test_tick_promotes_a_free_key_past_many_busy_ones)."""
        total, after, waiting = 0, "", False
        while True:
            keys, full_page = self._page(store, now, after)
            waiting = waiting or bool(keys)
            free = [key for key, has_room in keys if has_room]
            total += promote(store, free, now) if free else 0
            if not full_page:
                break
            after = keys[-1][0]
        self.swept_at = time.monotonic()
        self.waiting = waiting
        return total

    def _page(self, store: Any, now: int, after: str) -> tuple[list[tuple[str, bool]], bool]:
        """Up to KEYS_PER_SWEEP keys after ``after`` with due waiting jobs, each with whether it
        holds fewer slots than the largest limit of those jobs (one count of the slot index,
        rws_jobs_key_slot_unique), and whether the page was full."""
        n = self.KEYS_PER_SWEEP
        with store.cursor() as c:
            c.execute(
                "SELECT w.k, (SELECT COUNT(*) FROM rws_jobs h WHERE h.concurrency_key = w.k "
                "AND h.concurrency_slot IS NOT NULL) < w.lim FROM (SELECT concurrency_key AS k, "
                "MAX(COALESCE(concurrency_limit, 1)) AS lim FROM rws_jobs WHERE status = 'waiting' "
                "AND next_run_at <= %s AND concurrency_key > %s GROUP BY concurrency_key "
                f"ORDER BY concurrency_key LIMIT {n}) w ORDER BY w.k",
                [now, after],
            )
            keys = [(row[0], bool(row[1])) for row in c.fetchall()]
        return keys, len(keys) == n

    def blocked_in(self, store: Any, now: int, queues: list[str] | None, paused: frozenset[str]) -> bool:
        """Whether a due waiting job of ``queues`` (None: every queue) that is not paused waits
        for a key one of whose jobs is running: a --burst worker waits for such a job, and for
        no other waiting job (one whose key's slots are held by jobs of queues it does not
        serve, or paused, never starts in this burst:
        tests/test_concurrency_keys.py::test_a_burst_worker_exits_past_keys_it_cannot_serve)."""
        where = ""
        params: list[Any] = [now]
        if queues is not None:
            if not queues:
                return False
            where = f" AND w.queue IN ({', '.join(['%s'] * len(queues))})"
            params += queues
        elif paused:
            where = f" AND w.queue NOT IN ({', '.join(['%s'] * len(paused))})"
            params += sorted(paused)
        with store.cursor() as c:
            c.execute(
                "SELECT 1 FROM rws_jobs w WHERE w.status = 'waiting' AND w.next_run_at <= %s"
                f"{where} AND EXISTS (SELECT 1 FROM rws_jobs h WHERE h.concurrency_key = "
                "w.concurrency_key AND h.status = 'running') LIMIT 1",
                params,
            )
            return c.fetchone() is not None


def keys_of(jobs: Iterable[Any]) -> list[str]:
    """The concurrency keys of ``jobs`` (Claimed), those without one left out."""
    return [job.concurrency_key for job in jobs if job.concurrency_key is not None]
