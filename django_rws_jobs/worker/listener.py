"""PostgreSQL LISTEN/NOTIFY as a wake-up hint for idle workers.

A statement trigger on rws_jobs (migration 0002) notifies channel ``rws_jobs`` when rows are
inserted, whoever inserts them (the Rust crate too). Notifications are hints only: workers keep
polling every POLL_INTERVAL, so a connection pooler that breaks LISTEN costs latency, never jobs
(tests/test_worker.py::test_an_idle_postgres_worker_polls_when_no_notification_arrives).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from django.db import Error as DatabaseError
from django.db import connections

from ..conf import jobs_settings
from ..database import deadline
from .reconnect import Connection, Retry

CHANNEL = "rws_jobs"
#: Seconds between the listener's round trips on its idle connection.
PING_EVERY = 10.0


def listen_alias(alias: str) -> str | None:
    """The database alias the worker LISTENs on: RWS_JOBS["LISTEN_DATABASE"], else ``alias``
    unless a pooler in transaction mode stands in front of it (it hands the session to other
    clients between transactions, so notifications would reach them or nobody): None, the workers
    then poll every POLL_INTERVAL (tests/test_pooler.py)."""
    if jobs_settings.LISTEN_DATABASE is not None:
        return str(jobs_settings.LISTEN_DATABASE)
    from ..database.backends.postgresql import behind_transaction_pooler  # (PostgreSQL's only)

    return None if behind_transaction_pooler(connections.settings[alias]) else alias


class Listener:
    """Hold a connection that LISTENs on CHANNEL and set ``wake`` at each notification, until
    ``stop`` is set; reconnect (through Retry) when the connection breaks."""

    def __init__(self, stop: threading.Event, wake: threading.Event, alias: str):
        self.stop = stop
        self.wake = wake
        self.holder = Connection(alias)
        # Its call waits for notifications for ever: no deadline on it, but one on each ping.
        self.db = Retry(self.holder, stop, watched=False)
        self.watch = deadline.watch()

    def loop(self) -> None:
        try:
            self.db.until_stopped(self._listen, f"listening on {CHANNEL}")
        except DatabaseError:
            if not self.stop.is_set():
                raise  # an error that retrying cannot fix: the supervisor restarts this role later
        finally:
            self.holder.close()
            connections.close_all()

    def _listen(self, holder: Connection) -> None:
        conn = holder.connection()
        with conn.wrap_database_errors:  # psycopg's errors as Django's, for Retry to judge
            conn.ensure_connection()
            raw = conn.connection
            raw.autocommit = True
            self.watch.start(conn, f"listening on {CHANNEL}")
            try:
                raw.execute(f"LISTEN {CHANNEL}")
            finally:
                self.watch.done()
            next_ping = time.monotonic() + PING_EVERY
            while not self.stop.is_set():
                for _ in raw.notifies(timeout=0.5, stop_after=1):
                    self.wake.set()
                if time.monotonic() >= next_ping:
                    self._ping(conn, raw)
                    self.wake.set()  # a notification that arrived during the ping is not kept
                    next_ping = time.monotonic() + PING_EVERY

    def _ping(self, conn: Any, raw: Any) -> None:
        """A round trip: an idle connection whose peer died silently never delivers a
        notification, and without one nothing would notice (deadline.py cuts a ping that gets
        no answer)."""
        self.watch.start(conn, f"checking the connection that listens on {CHANNEL}")
        try:
            raw.execute("SELECT 1")
        finally:
            self.watch.done()
