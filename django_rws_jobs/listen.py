"""PostgreSQL LISTEN/NOTIFY as a wake-up hint for idle workers.

A statement trigger on rws_jobs (migration 0002) notifies channel ``rws_jobs`` when rows are
inserted, whoever inserts them (the Rust crate too). Notifications are hints only: workers keep
polling every POLL_INTERVAL, so a connection pooler that breaks LISTEN costs latency, never jobs.
"""

from __future__ import annotations

import logging
import threading

from django.db import DatabaseError, connections

from .db import private_connection

logger = logging.getLogger("django_rws_jobs")
CHANNEL = "rws_jobs"


def listen_loop(stop: threading.Event, wake: threading.Event, alias: str) -> None:
    delay = 0.5
    while not stop.is_set():
        conn = private_connection(alias)
        try:
            conn.ensure_connection()
            raw = conn.connection
            raw.autocommit = True
            raw.execute(f"LISTEN {CHANNEL}")
            delay = 0.5
            while not stop.is_set():
                for _ in raw.notifies(timeout=0.5, stop_after=1):
                    wake.set()
        except (DatabaseError, Exception) as exc:  # psycopg errors are not Django's
            if stop.is_set():
                break
            logger.warning("LISTEN %s failed (%s); polling only, retrying in %.1fs", CHANNEL, exc, delay)
            stop.wait(delay)
            delay = min(delay * 2, 10.0)
        finally:
            try:
                conn.close()
            except Exception:  # already broken
                pass
    connections.close_all()
