"""The one way the queue's threads talk to a database that may go away: a connection that is
reopened after an error, and a retry helper with three explicit kinds of patience.

The worker's roles, the PostgreSQL listener, the scheduler and ``tick``'s lease renewal all use it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import Error as DatabaseError
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from . import deadline
from .db import is_transient, private_connection
from .store import Store

logger = logging.getLogger("django_rws_jobs")

#: The first wait after a failure, doubled after each one up to MAX_DELAY (seconds).
FIRST_DELAY = 0.2
MAX_DELAY = 5.0


class Connection:
    """A thread's connection to the queue's database, opened on first use, dropped after an error.

    ``private`` (the default) is a connection of the thread's own, which Django's per-request
    handling never closes; otherwise it is Django's connection for this thread, reopened when an
    error left it unusable.
    """

    def __init__(self, alias: str, *, private: bool = True):
        self.alias = alias
        self.private = private
        self._conn: BaseDatabaseWrapper | None = None
        self._store: Store | None = None

    def connection(self) -> BaseDatabaseWrapper:
        if not self.private:
            conn = connections[self.alias]
            if conn.connection is not None and conn.errors_occurred and not conn.is_usable():
                conn.close()  # reconnect after the database went away
            return conn
        if self._conn is None:
            self._conn = private_connection(self.alias)
        return self._conn

    def store(self) -> Store:
        # One Store per connection: it is asked for on every claim and completion.
        if self._store is None:
            self._store = Store(self.connection())
        return self._store

    def reset(self) -> None:
        """Drop the connection; the next use opens a new one."""
        conn = self._conn if self.private else connections[self.alias]
        self._conn, self._store = None, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001, S110  (already broken: dropping it is all we need)
                pass

    close = reset


class Retry:
    """Run a database call (a function of a :class:`Connection`), reconnecting and waiting while the database
    is unreachable. Three kinds of patience, each a method:

    - :meth:`until_stopped`: until it succeeds or ``stop`` is set (then the error is raised);
    - :meth:`until`: until a ``time.monotonic()`` deadline, stopping or not (an outcome must be
      written if at all possible);
    - :meth:`once`: one try; on an error the connection is dropped and the error raised.

    An error that retrying cannot fix (see ``db.is_transient``) is raised at once, whatever the
    kind (tests/test_faults.py::test_a_worker_without_its_tables_fails_fast).
    """

    def __init__(self, holder: Connection, stop: threading.Event | None = None, *, watched: bool = True):
        self.holder = holder
        self.stop = stop if stop is not None else threading.Event()
        self._pause = threading.Event()  # never set: a plain wait that a stop does not cut short
        # Each call is one short piece of work: past STATEMENT_DEADLINE its connection is taken
        # for dead (deadline.py). The listener, whose call waits for ever, watches its own pings.
        self._watch = deadline.watch() if watched else None

    def until_stopped(self, fn: Callable[[Connection], Any], what: str) -> Any:
        return self._run(fn, what, None)

    def until(self, deadline: float, fn: Callable[[Connection], Any], what: str) -> Any:
        return self._run(fn, what, deadline)

    def once(self, fn: Callable[[Connection], Any], what: str) -> Any:
        return self._run(fn, what, 0.0)

    def _run(self, fn: Callable[[Connection], Any], what: str, deadline: float | None) -> Any:
        delay = FIRST_DELAY
        w = self._watch
        while True:
            try:
                if w is None:
                    return fn(self.holder)
                w.start(self.holder.connection(), what)
                try:
                    return fn(self.holder)
                finally:
                    w.done()
            except DatabaseError as exc:
                self.holder.reset()
                if not is_transient(exc):
                    raise
                if deadline is None:
                    give_up = self.stop.is_set()
                else:
                    give_up = time.monotonic() + delay >= deadline
                if give_up:
                    logger.warning("database error while %s: %s; giving up", what, exc)
                    raise
                logger.warning("database error while %s: %s; retrying in %.1fs", what, exc, delay)
                if deadline is None:
                    if self.stop.wait(delay):
                        raise
                else:
                    self._pause.wait(delay)
                delay = min(delay * 2, MAX_DELAY)
