"""The queue's clock: on PostgreSQL and MariaDB/MySQL the database server's, on SQLite the host's.

Every time the queue compares or writes (due times, leases, recovery, backoff, cron, enqueue's
"now", the tasks backend, pruning, the admin) comes from :func:`now`. With many machines on one
database, their own clocks disagree; the server's is the one they share (docs/design.md, "One
clock").

The server's time is read once by a statement (``features.server_clock_sql``) and then carried
forward on this process's monotonic clock: ``now() = monotonic() + base``. A host clock that is
set wrong or jumps (a VM resumed, NTP stepping it) changes nothing. The base is read again every
:data:`REFRESH` seconds by whoever asks (in a worker, only its lease keeper, every
``REFRESH / 2``), so a
server whose own clock is stepped is followed within that. A read that fails keeps the last base
(or, with none, the host's clock): asking the time never raises.

Pinned by tests/test_clock.py (faketime shifts a worker's and a web process's clock).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from django.db import DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from ..conf import jobs_settings
from .backends import backend_for
from .connections import queue_alias

logger = logging.getLogger("django_rws_jobs")

#: Seconds a reading of the server's clock is used before it is read again.
REFRESH = 60.0
#: Above this many seconds between the host's clock and the database's, the worker warns.
WARN_OFFSET = 2.0


@dataclass(frozen=True)
class Reading:
    base: float  # the server's unix time minus time.monotonic()
    offset: float  # the server's unix time minus the host's time.time(), at the reading
    taken: float  # time.monotonic() of the reading
    round_trip: float  # seconds the statement took; the reading is good to half of it


_readings: dict[str, Reading | None] = {}  # None: this alias lives in the host's clock
_lazy = True  # see kept_fresh_by_caller


def read(conn: BaseDatabaseWrapper) -> Reading | None:
    """Read the server's clock through ``conn`` and keep the reading for its alias.

    Returns None for a database that lives in the host's clock. Raises the database's errors.
    """
    sql = backend_for(conn).features.server_clock_sql
    if sql is None:
        _readings[conn.alias] = None
        return None
    with conn.cursor() as cursor:
        before, wall = time.monotonic(), time.time()
        cursor.execute(sql)
        server = float(cursor.fetchone()[0])
        after = time.monotonic()
    middle = (before + after) / 2
    reading = Reading(
        base=server - middle,
        offset=server - (wall + (after - before) / 2),
        taken=after,
        round_trip=after - before,
    )
    _readings[conn.alias] = reading  # one assignment: readers see the old reading or this one
    return reading


def now(using: str | None = None) -> float:
    """The queue's time in unix seconds: the database server's, or the host's on SQLite."""
    alias = jobs_settings.DATABASE if using is None else using
    try:
        reading = _readings[alias]
    except KeyError:
        reading = _refresh(queue_alias(alias), None)
    else:
        if reading is not None and _lazy and time.monotonic() - reading.taken > REFRESH:
            reading = _refresh(alias, reading)
    if reading is None:
        return time.time()
    return time.monotonic() + reading.base


def kept_fresh_by_caller() -> None:
    """From now on :func:`now` reads the clock only when no reading is kept: the caller (the
    worker's lease keeper, on its own connection with its deadlines) refreshes it. A worker's
    threads then never block on a connection of Django's to ask the time."""
    global _lazy
    _lazy = False


def _refresh(alias: str, last: Reading | None) -> Reading | None:
    """Read the clock through the calling thread's Django connection; on a database error keep
    ``last`` (which may be None: then the host's clock serves until a reading succeeds)."""
    try:
        return read(connections[alias])
    except DatabaseError as exc:
        logger.debug("could not read the database's clock (%s): %s", alias, exc)
        return last


def describe(reading: Reading | None) -> str:
    """Which clock the queue keeps, for the worker's start-up line: one sentence shape on every
    database (tests/test_worker.py::test_the_log_says_why_a_job_failed_and_which_clock_decides)."""
    if reading is None:
        return "clock: this host's (the database has no clock of its own)"
    return f"clock: the database's (this host's is {_offset(reading, 'it')})"


def _offset(reading: Reading, other: str) -> str:
    side = "behind" if reading.offset > 0 else "ahead of"
    return f"{abs(reading.offset):.3f}s {side} {other}"


def iso(seconds: float) -> str:
    """A queue time (unix seconds) as the logs write it: ISO 8601 in UTC, to the second."""
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))
    except (OverflowError, ValueError, OSError):  # past what the platform's calendar holds
        return f"{seconds} (unix seconds)"


def warn_if_off(reading: Reading | None, last_warned: float | None) -> float | None:
    """Log a WARNING when the host's clock is more than WARN_OFFSET from the database's, unless
    ``last_warned`` (the offset last warned of) is within a second of it. Returns the offset
    now warned of, or None when there is nothing to warn of."""
    if reading is None or abs(reading.offset) <= WARN_OFFSET:
        return None
    if last_warned is not None and abs(reading.offset - last_warned) < 1.0:
        return last_warned
    logger.warning(
        "this host's clock is %s (more than %ss): the queue keeps the database's time, but check "
        "this host's NTP",
        _offset(reading, "the database's"),
        WARN_OFFSET,
    )
    return reading.offset


def forget() -> None:
    """Drop every kept reading (tests; a process that changed its DATABASES)."""
    _readings.clear()


__all__ = [
    "REFRESH",
    "WARN_OFFSET",
    "Reading",
    "describe",
    "forget",
    "iso",
    "kept_fresh_by_caller",
    "now",
    "read",
    "warn_if_off",
]
