"""Enqueueing once per burst: what a unique job's enqueue does when its key is taken.

- ``on_conflict="skip"`` (the default): the live job holding the key keeps it; its id is returned.
- ``on_conflict="replace"``: a holder that waits (pending, waiting for its concurrency key, or
  blocked) takes the call's payload, due time and options, in one statement whose condition
  includes its status (``replace_job``), and its id is returned. A running holder is never
  changed: the call stores its successor, blocked until the holder ends, under the key's
  successor hash (one per key; a replace while the holder runs replaces it), which takes the
  key's own hash once released (workflows/successors.py). Two replaces racing leave one waiting
  job: the database's unique index lets one insert win, and the other replaces it.
- ``max_delay=M`` (with replace): a burst's first job is due no later than ``M`` seconds after
  its enqueue (``rws_jobs.due_by``); a replace never moves it past that.
- ``unique_for=S``: a throttle. The enqueue that stores the job takes the key's window in
  ``rws_unique_windows`` until ``now + S``; an enqueue inside an open window stores nothing and
  returns the id of the job that took it. The window row is taken by INSERT, or by an UPDATE
  fenced on ``until <= now`` once it passed, after a locking read: two enqueues never both take
  it. The workers delete passed windows (``prune_windows``).

Each returns an ``Enqueued``: the id, a ``str`` as before, with ``outcome`` "stored", "skipped" or
"replaced". Pinned by tests/test_enqueue_once.py.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, connections, transaction

from ..database.backends import backend_for
from ..database.backends.cursors import kept_cursor
from ..database.backends.inserts import INSERT_SQL
from ..database.validation import show
from ..models import Status
from ..queue.unique_keys import successor_hash
from ..workflows import dependencies
from ..workflows.successors import SUCCESSOR_POLICY

#: enqueue's on_conflict values.
ON_CONFLICT = ("skip", "replace")
#: The longest max_delay and unique_for, in seconds: a year, as RWS_JOBS["BACKOFF_MAX"].
SECONDS_MAX = 365 * 86400
#: The statuses of a holder that a replace changes: it has not started.
WAITS = ("pending", "waiting", "blocked")
#: Tries before giving up on a key that keeps changing hands under the call.
TRIES = 10

STORED, SKIPPED, REPLACED = "stored", "skipped", "replaced"

#: What a replace changes of a waiting holder (and where prepare() put each in the row).
REPLACED_COLUMNS = (
    ("payload", 2),
    ("max_retries", 3),
    ("queue", 6),
    ("priority", 7),
    ("timeout", 9),
    ("metadata", 15),
)


class Enqueued(str):
    """A job's id as ``enqueue`` returns it (a ``str``), and what the call did: ``outcome`` is
    "stored" (a new job), "skipped" (nothing stored: the id is the job that holds the key, or
    that took its throttle window) or "replaced" (a waiting job took this call's payload, due
    time and options: its id). One subclass per outcome, so that making one is str's own
    constructor: a plain enqueue pays for no more (docs/benchmarks.md)."""

    __slots__ = ()
    outcome = ""


class Stored(Enqueued):
    __slots__ = ()
    outcome = STORED


class Skipped(Enqueued):
    __slots__ = ()
    outcome = SKIPPED


class Replaced(Enqueued):
    __slots__ = ()
    outcome = REPLACED


@dataclass(frozen=True)
class Once:
    """A unique job's checked options beyond ``skip``."""

    replace: bool
    max_delay: float | None
    unique_for: float | None


def once_options(
    unique: Any, on_conflict: Any, max_delay: Any, unique_for: Any, after: Any = None
) -> Once | None:
    """The options checked, before anything is written; None for today's "skip". Bad values and
    combinations are a TypeError or ValueError naming them (tests/test_enqueue_once.py
    test_bad_options_are_clear_errors)."""
    if on_conflict not in ON_CONFLICT:
        raise ValueError(
            f"on_conflict must be one of {', '.join(map(repr, ON_CONFLICT))}, got {show(on_conflict)}"
        )
    replace = on_conflict == "replace"
    if unique is None and (replace or unique_for is not None):
        what = "on_conflict='replace'" if replace else "unique_for"
        raise ValueError(f"{what} needs unique=key: it says what to do when the key is taken")
    if max_delay is not None and not replace:
        raise ValueError("max_delay needs on_conflict='replace': it bounds how far replaces push a job")
    if replace and unique_for is not None:
        raise ValueError(
            "unique_for and on_conflict='replace' do not go together: a throttle stores nothing in its window"
        )
    if replace and after is not None:
        raise ValueError(
            "on_conflict='replace' and after= do not go together: a replaced job keeps what it waits for"
        )
    if not replace and unique_for is None:
        return None
    return Once(replace, _seconds("max_delay", max_delay), _seconds("unique_for", unique_for, above=True))


def _seconds(name: str, value: Any, *, above: bool = False) -> float | None:
    if value is None:
        return None
    if isinstance(value, dt.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"{name} must be a number of seconds or a timedelta, got {type(value).__name__} {show(value)}"
        )
    low_ok = value > 0 if above else value >= 0
    if not math.isfinite(value) or not low_ok or value > SECONDS_MAX:
        bounds = f"{'(' if above else '['}0, {SECONDS_MAX}]"
        raise ValueError(f"{name} must be a finite number of seconds in {bounds}, got {show(value)}")
    return float(value)


def insert_once(alias: str, params: list[Any], once: Once) -> Enqueued:
    """Store the unique job ``params`` (prepare's row) as ``once`` says, in the caller's
    transaction; see the module's docstring."""
    if once.unique_for is not None:
        return _throttled(alias, params, once.unique_for)
    return _replaced(alias, params, once)


def _replaced(alias: str, params: list[Any], once: Once) -> Enqueued:
    """A waiting holder replaced, or the job stored: beside a running holder, as its successor."""
    due_by = None if once.max_delay is None else math.floor(params[5] + once.max_delay)
    if due_by is not None:
        params[4] = min(params[4], due_by)
    inside = connections[alias].in_atomic_block
    for _ in range(TRIES):
        found = (_running_holder(alias, params[-1]) if inside else None) or _replace(
            alias, params, once, due_by
        )
        if isinstance(found, Enqueued):
            return found
        stored = _stored_after(alias, params, once, due_by, found)
        if stored is not None:
            return stored
        # The holder ended meanwhile: its key is free again.
    raise RuntimeError(f"could not enqueue unique job {params[1]!r} key {params[8]!r}: kept conflicting")


def _stored_after(
    alias: str, params: list[Any], once: Once, due_by: int | None, holder: str
) -> Enqueued | None:
    """The job stored to run after the running ``holder`` (or the one stored so replaced): it
    holds the key's successor hash, so there is one per key, and waits for the holder through
    a dependency whose policy is "next" (run after it, whatever its outcome); released, it takes
    the key's own hash (workflows/successors.py). None when the holder has ended meanwhile: the
    savepoint undoes the insert."""
    successor = list(params)
    successor[10] = "blocked"
    successor[-1] = successor_hash(params[-1])
    try:
        with transaction.atomic(using=alias):
            found = _replace(alias, successor, once, due_by)
            if not isinstance(found, Enqueued):
                raise _HolderEnded  # a successor that runs: not one of ours, let the caller try again
            if found.outcome == STORED:
                status = dependencies.add(connections[alias], found, [(holder, False)], SUCCESSOR_POLICY)
                if status != "blocked":
                    raise _HolderEnded
            return found
    except _HolderEnded:
        return None


def _running_holder(alias: str, digest: str) -> str | None:
    """The running holder of the key, by a plain read: inside the caller's transaction a replace
    leaves its row unlocked, where the upsert would lock it (``ON CONFLICT`` and ``ON DUPLICATE
    KEY UPDATE`` lock the row they meet) until the caller commits, holding up its worker's
    renewals and outcome (tests/test_enqueue_once.py::
    test_a_replace_in_an_open_transaction_does_not_hold_a_running_holders_worker)."""
    with connections[alias].cursor() as c:
        c.execute("SELECT id FROM rws_jobs WHERE unique_hash = %s AND status = 'running'", [digest])
        row = c.fetchone()
    return None if row is None else str(row[0])


class _HolderEnded(Exception):
    """The running holder a successor was to wait for has ended."""


def _replace(alias: str, params: list[Any], once: Once, due_by: int | None) -> Enqueued | str:
    """One statement where it can (``replace_job``): an insert, or a waiting holder replaced; the
    holder that runs (or a failed one that kept its hash) goes the long way. Returns what was
    done, or the id of the holder that runs (a plain ``str``)."""
    conn = connections[alias]
    backend = backend_for(conn)
    max_delay = None if once.max_delay is None else math.floor(once.max_delay)
    statement = backend.replace_job(params, due_by, max_delay)
    if backend.replace_returns:  # one statement: no transaction of its own needed
        kept = kept_cursor(conn)
        if kept is None:
            with conn.cursor() as c:
                c.execute(*statement)
                row = c.fetchone()
        else:
            kept.execute(*statement)
            row = kept.fetchone()
    else:
        with transaction.atomic(using=alias), conn.cursor() as c:
            c.execute(*statement)
            # The row read back under the lock the statement took.
            lock = backend.features.row_lock
            c.execute("SELECT id, status FROM rws_jobs WHERE unique_hash = %s" + lock, [params[-1]])
            row = c.fetchone()
    if row is not None and row[0] == params[0]:
        return Stored(params[0])
    if row is not None and row[1] in WAITS:
        return Replaced(row[0])
    if row is not None and row[1] == "running":
        return str(row[0])  # (MariaDB's RETURNING gives the row it left alone)
    return _replaced_slowly(alias, params, once, due_by)


def _replaced_slowly(alias: str, params: list[Any], once: Once, due_by: int | None) -> Enqueued | str:
    conn = connections[alias]
    digest = params[-1]
    lock = backend_for(conn).features.row_lock
    for _ in range(TRIES):
        try:
            with transaction.atomic(using=alias), conn.cursor() as c:
                c.execute(INSERT_SQL, params)
                if due_by is not None:
                    c.execute("UPDATE rws_jobs SET due_by = %s WHERE id = %s", [due_by, params[0]])
            return Stored(params[0])
        except IntegrityError:
            pass
        with transaction.atomic(using=alias), conn.cursor() as c:
            c.execute(
                "SELECT id, status, due_by, created_at FROM rws_jobs WHERE unique_hash = %s" + lock, [digest]
            )
            row = c.fetchone()
            if row is None:
                continue  # the holder ended between the two statements: insert again
            holder, status, held_due_by, created_at = row
            if status in WAITS:
                cap = held_due_by
                if cap is None and once.max_delay is not None:
                    cap = math.floor(created_at + once.max_delay)  # its burst began at its enqueue
                due = params[4] if cap is None else min(params[4], cap)
                sets = ", ".join(f"{column} = %s" for column, _ in REPLACED_COLUMNS)
                c.execute(
                    f"UPDATE rws_jobs SET {sets}, next_run_at = %s, due_by = %s "
                    "WHERE id = %s AND unique_hash = %s AND status IN ('pending', 'waiting', 'blocked')",
                    [*(params[i] for _, i in REPLACED_COLUMNS), due, cap, holder, digest],
                )
                if c.rowcount == 1:
                    return Replaced(holder)
                continue
            if status == "running":
                # Never changed, and its row not touched at all: an update of a running row
                # would change the row version its worker's completion deletes by (PostgreSQL's
                # ctid), and drop its outcome. The caller stores the job after it.
                return str(holder)
            # A failed row still holding the key (a rust-web-server writer does not clear it): free it.
            c.execute("UPDATE rws_jobs SET unique_hash = NULL WHERE id = %s AND status = 'failed'", [holder])
    raise RuntimeError(f"could not enqueue unique job {params[1]!r} key {params[8]!r}: kept conflicting")


def _throttled(alias: str, params: list[Any], seconds: float) -> Enqueued:
    conn = connections[alias]
    backend = backend_for(conn)
    until = math.ceil(params[5] + seconds)
    digest = params[-1]
    try:
        with transaction.atomic(using=alias):
            with conn.cursor() as c:
                c.execute(*backend.take_window(digest, params[0], int(params[5]), until))
                # A locking read: the latest commit, whatever the transaction's snapshot
                # (MariaDB's REPEATABLE READ); the upsert holds the row's lock already.
                lock = backend.features.row_lock
                c.execute("SELECT job_id FROM rws_unique_windows WHERE unique_hash = %s" + lock, [digest])
                (taken_by,) = c.fetchone()
            if taken_by != params[0]:
                return Skipped(taken_by)  # an open window: nothing stored
            job_id = insert_unique(alias, params)
            if job_id != params[0]:
                raise _Held(job_id)  # a live job holds the key: the window goes back as it was
        return Stored(job_id)
    except _Held as held:
        return Skipped(held.holder)


class _Held(Exception):
    """A throttled job that was not stored: a live job holds its key."""

    def __init__(self, holder: str):
        self.holder = holder


def insert_unique(alias: str, params: list[Any]) -> str:
    conn = connections[alias]
    digest = params[-1]
    # A shared-lock read sees the latest commit even where a plain read sees an older snapshot
    # (MySQL's REPEATABLE READ); it is only the fallback, because it holds the holder's row until
    # the caller commits.
    share = backend_for(conn).features.shared_lock
    lookup = "SELECT id, status FROM rws_jobs WHERE unique_hash = %s"
    for _ in range(10):
        try:
            with transaction.atomic(using=alias), conn.cursor() as c:
                c.execute(INSERT_SQL, params)
            return params[0]
        except IntegrityError:
            pass
        with transaction.atomic(using=alias), conn.cursor() as c:
            c.execute(lookup, [digest])
            row = c.fetchone()
            if row is None and share:
                c.execute(lookup + share, [digest])
                row = c.fetchone()
            if row is not None and row[1] in (Status.PENDING, Status.RUNNING, Status.WAITING):
                return row[0]
            if row is not None:
                # A failed row still holding the key (a rust-web-server writer does not clear it): free it.
                c.execute(
                    "UPDATE rws_jobs SET unique_hash = NULL WHERE id = %s AND status = 'failed'", [row[0]]
                )
        # Otherwise the holder finished between the two statements: insert again.
    raise RuntimeError(f"could not enqueue unique job {params[1]!r} key {params[8]!r}: kept conflicting")


def prune_windows(store: Any, now: int) -> int:
    """Delete the throttle windows that have passed (the lease keeper's tidy-up): how many."""
    with store.writes, store.cursor() as c:
        c.execute("DELETE FROM rws_unique_windows WHERE until <= %s", [now])
        return int(c.rowcount)
