"""The one way the queue's threads talk to a database that may go away: a connection that is
reopened after an error, and a retry helper with three explicit kinds of patience.

The worker's roles, the PostgreSQL listener, the scheduler and ``tick``'s lease renewal all use it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from django.db import Error as DatabaseError
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from ..database import deadline
from ..database.connections import is_transient, private_connection
from ..queue.store import Store

logger = logging.getLogger("django_rws_jobs")

_NO_LOCK: AbstractContextManager[Any] = nullcontext()  # (reusable: it holds nothing)

#: The first wait after a failure, doubled after each one up to MAX_DELAY (seconds).
FIRST_DELAY = 0.2
MAX_DELAY = 5.0


class Connection:
    """A thread's connection to the queue's database, opened on first use, dropped after an error.

    ``private`` (the default) is a connection of the thread's own, which Django's per-request
    handling never closes; otherwise it is Django's connection for this thread, reopened when an
    error left it unusable. ``shared``: a private connection that several threads use in turn,
    each call of a :class:`Retry` holding ``lock`` (the worker's bookkeeping roles, so that a
    worker holds at most its threads + 4 connections: tests/test_pooler.py).
    """

    def __init__(self, alias: str, *, private: bool = True, shared: bool = False):
        self.alias = alias
        self.private = private or shared
        self.lock: AbstractContextManager[Any] = threading.RLock() if shared else _NO_LOCK
        self._shared = shared
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
            if self._shared:
                self._conn.inc_thread_sharing()
        return self._conn

    @contextmanager
    def registered(self) -> Iterator[BaseDatabaseWrapper]:
        """This connection as the calling thread's Django connection for its alias while the block
        runs, for code that goes through the ORM (the scheduler's tick, pruning task results)."""
        conn = self.connection()
        if not self.private:
            yield conn
            return
        before = connections[self.alias]
        connections[self.alias] = conn
        try:
            yield conn
        finally:
            connections[self.alias] = before

    def store(self) -> Store:
        # One Store per connection: it is asked for on every claim and completion.
        if self._store is None:
            self._store = Store(self.connection())
        return self._store

    def reset(self) -> None:
        """Drop the connection; the next use opens a new one."""
        with self.lock:
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
        holder = self.holder
        while True:
            try:
                with holder.lock:
                    try:
                        if w is None:
                            return fn(holder)
                        w.start(holder.connection(), what)
                        try:
                            return fn(holder)
                        finally:
                            w.done()
                    except DatabaseError:
                        holder.reset()
                        raise
            except DatabaseError as exc:
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
