"""PostgreSQL LISTEN/NOTIFY as a wake-up hint for idle workers.

A statement trigger on rws_jobs (migration 0002) notifies channel ``rws_jobs`` when rows are
inserted, whoever inserts them (the Rust crate too). Notifications are hints only: workers keep
polling every POLL_INTERVAL, so a connection pooler that breaks LISTEN costs latency, never jobs
(tests/test_worker.py::test_an_idle_postgres_worker_polls_when_no_notification_arrives).
"""

from __future__ import annotations

import threading

from django.db import Error as DatabaseError
from django.db import connections

from ..reconnect import Connection, Retry

CHANNEL = "rws_jobs"


class Listener:
    """Hold a connection that LISTENs on CHANNEL and set ``wake`` at each notification, until
    ``stop`` is set; reconnect (through Retry) when the connection breaks."""

    def __init__(self, stop: threading.Event, wake: threading.Event, alias: str):
        self.stop = stop
        self.wake = wake
        self.holder = Connection(alias)
        self.db = Retry(self.holder, stop)

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
            raw.execute(f"LISTEN {CHANNEL}")
            while not self.stop.is_set():
                for _ in raw.notifies(timeout=0.5, stop_after=1):
                    self.wake.set()
