"""The job a replace stores beside a running holder of its key (``enqueue(unique=key,
on_conflict="replace")``, api/enqueue_once.py): its successor, run once the holder has ended.

Invariants (tests/test_enqueue_once.py, "successors"):

- A successor is blocked and holds the key's successor hash (queue/unique_keys.py), so a key has
  one at most: a replace that meets a running holder replaces the successor that waits already.
- It waits for the holder through a dependency whose policy is "next": it runs after the holder
  ends, whatever its outcome (dependency_outcomes.decide counts a failure as done, as for "run").
- Released, it takes the key's own hash in the statement that makes it pending (``release``), so
  that from then on it is the key's holder, which a skip, a replace or rust-web-server's check
  sees.
- If a job took the key between the holder's end and that release (an enqueue that found it
  free), the successor is not released beside it: a running taker becomes what it waits for; a
  waiting taker holds the newer payload, and the successor is cancelled, saying so.
- The successor is released by whoever resolves it, as any blocked job (the holder's worker, an
  enqueue's recheck, the keeper's sweep), each write conditional on ``status = 'blocked'``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

from django.db import IntegrityError, transaction

from ..database.backends.base import is_registered
from ..queue.unique_keys import successor_hash, unique_hash

logger = logging.getLogger("django_rws_jobs")

#: The policy of a successor's dependency on the holder of its key.
SUCCESSOR_POLICY = "next"
#: What a successor cancelled because a newer job took its key carries as its error.
SUPERSEDED_ERROR = (
    "cancelled: a newer job with its unique key was enqueued once the job it waited for had ended"
)
#: Looks at a successor's key before leaving it blocked for the next resolve.
TRIES = 5

RELEASE_SQL = (
    "UPDATE rws_jobs SET status = CASE WHEN concurrency_key IS NULL THEN 'pending' ELSE 'waiting' END, "
    "unique_hash = %s WHERE id = %s AND status = 'blocked' AND unique_hash = %s"
)
PLAIN_RELEASE_SQL = (
    "UPDATE rws_jobs SET status = CASE WHEN concurrency_key IS NULL THEN 'pending' ELSE 'waiting' END "
    "WHERE id = %s AND status = 'blocked'"
)


def release(store: Any, job_ids: Sequence[str], now: int) -> tuple[int, list[str]]:
    """Release the blocked successors among ``job_ids``, whose holders have ended: (how many
    released, the ids cancelled)."""
    released: list[str] = []
    cancelled: list[str] = []
    for job_id in job_ids:
        for _ in range(TRIES):
            done = _release_one(store, job_id, now)
            if done == "released":
                released.append(job_id)
            elif done == "cancelled":
                cancelled.append(job_id)
            if done is not None:
                break
    if cancelled:
        logger.warning("%d successor job(s) cancelled: a newer job took their unique key", len(cancelled))
    return len(released), cancelled


def _release_one(store: Any, job_id: str, now: int) -> str | None:
    """ "released", "cancelled", "left" (blocked, for a taker that runs; or no longer blocked),
    or None: look again."""
    with store.cursor() as c:
        c.execute(
            "SELECT job_type, unique_key, unique_hash FROM rws_jobs WHERE id = %s AND status = 'blocked'",
            [job_id],
        )
        row = c.fetchone()
    if row is None:
        return "left"  # released or cancelled by another resolver
    job_type, key, held = row
    digest = None if key is None else unique_hash(job_type, key)
    if digest is None or held != successor_hash(digest):
        # Not (or no longer: a retried one took the key's own hash) holding a successor's hash.
        with store.writes, store.cursor() as c:
            c.execute(PLAIN_RELEASE_SQL, [job_id])
            return "released" if c.rowcount else "left"
    try:
        with store.writes, _statement_alone(store), store.cursor() as c:
            c.execute(RELEASE_SQL, [digest, job_id, held])
            return "released" if c.rowcount else None
    except IntegrityError:
        pass  # a job took the key after the holder ended
    with store.cursor() as c:
        c.execute("SELECT id, status FROM rws_jobs WHERE unique_hash = %s", [digest])
        taker = c.fetchone()
    if taker is None:
        return None  # it ended meanwhile: the key is free again
    if taker[1] == "running":
        return "left" if _wait_for(store, job_id, taker[0]) else None
    with store.writes, store.cursor() as c:
        c.execute(
            "UPDATE rws_jobs SET status = 'cancelled', cancelled_at = %s, unique_hash = NULL, "
            "last_error = %s WHERE id = %s AND status = 'blocked'",
            [now, SUPERSEDED_ERROR, job_id],
        )
        return "cancelled" if c.rowcount else "left"


def _wait_for(store: Any, job_id: str, taker: str) -> bool:
    """Make the successor ``job_id`` wait for ``taker``, the job that runs under its key now;
    False if the taker ended before its flag was set (nothing would resolve the successor then
    but the sweep: the caller looks again at once)."""
    with store.writes, store.cursor() as c:
        c.execute(
            "UPDATE rws_job_dependencies SET depends_on = %s, outcome = NULL "
            "WHERE job_id = %s AND policy = %s",
            [taker, job_id, SUCCESSOR_POLICY],
        )
        c.execute("UPDATE rws_jobs SET has_dependents = TRUE WHERE id = %s", [taker])
    with store.cursor() as c:
        c.execute("SELECT status FROM rws_jobs WHERE id = %s", [taker])
        row = c.fetchone()
    return row is not None and row[0] == "running"


def _statement_alone(store: Any) -> Any:
    """Where a statement that fails must not end the transaction it is in: a savepoint on
    Django's connection (a caller's transaction). The worker's own connections run it on its
    own, or in SQLite's claim transaction, where a failed statement is undone alone."""
    return transaction.atomic(using=store.conn.alias) if is_registered(store.conn) else nullcontext()
