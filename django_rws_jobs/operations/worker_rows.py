"""Live workers: each ``rws_worker`` process's row in ``rws_workers`` (model Worker).

A worker inserts its row after its start-up recovery, renews it with every round of its lease
keeper (the heartbeat: the queue's clock, the jobs it holds, its counts), and deletes it when it
stops cleanly. A renewal that finds no row (an operator deleted it, or another worker forgot it
during a long pause) inserts it again. A row whose heartbeat is older than DEAD_AFTER of its
intervals is a dead worker's: ``workers()`` leaves it out, the admin shows it dead, and any
worker deletes it FORGET_AFTER seconds after its last heartbeat
(tests/test_workers.py::test_workers_register_beat_and_leave).
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..conf import jobs_settings
from ..database import clock
from ..database.connections import queue_alias
from ..models import Worker

logger = logging.getLogger("django_rws_jobs")

#: A worker is dead once its heartbeat is older than this many of its intervals.
DEAD_AFTER = 3
#: Seconds after its last heartbeat that any worker deletes a dead worker's row.
FORGET_AFTER = 3600
#: At most this many job ids in a row's ``running`` (a worker holds one job per executor).
RUNNING_MAX = 1000

COLUMNS = (
    "id, host, pid, queues, pool, executors, version, started_at, heartbeat_at, heartbeat_interval, "
    "running, done, failed"
)


def heartbeat_interval() -> float:
    """Seconds between two heartbeats: the lease keeper's round, a third of LEASE_SECONDS."""

    return max(int(jobs_settings.LEASE_SECONDS) / 3, 0.2)


def touch(path: str) -> None:
    """Set a heartbeat file's modification time to now, creating it if needed (rws_health
    --heartbeat-file reads it without the database)."""
    with open(path, "a"):
        pass
    os.utime(path)


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("django-rws-jobs")
    except PackageNotFoundError:
        return "unknown"


def this_host() -> str:
    return socket.gethostname()


@dataclass
class Registration:
    """What a worker says of itself in its row."""

    id: str
    queues: Sequence[str] | None
    pool: str
    executors: int
    interval: float
    started_at: int | None = None

    def _values(self, now: int, running: list[str], done: int, failed: int) -> list[Any]:
        if self.started_at is None:
            self.started_at = now
        return [
            self.id,
            this_host()[:255],
            os.getpid(),
            ",".join(self.queues or ()),
            self.pool,
            self.executors,
            package_version()[:64],
            self.started_at,
            now,
            self.interval,
            json.dumps(running[:RUNNING_MAX]),
            done,
            failed,
        ]

    def register(
        self, store: Any, now: int, running: Sequence[str] = (), done: int = 0, failed: int = 0
    ) -> None:
        """Insert this worker's row; one left by an earlier registration of this id is replaced."""
        values = self._values(now, list(running), done, failed)
        with store.writes, store.atomic(), store.cursor() as c:
            c.execute("DELETE FROM rws_workers WHERE id = %s", [self.id])
            marks = ", ".join(["%s"] * len(values))
            c.execute(f"INSERT INTO rws_workers ({COLUMNS}) VALUES ({marks})", values)

    def beat(
        self,
        store: Any,
        now: int,
        running: Sequence[str],
        done: int,
        failed: int,
        claim_p99: float | None = None,
    ) -> bool:
        """Renew the row; False when it was gone and has been inserted again."""
        with store.writes, store.cursor() as c:
            c.execute(
                "UPDATE rws_workers SET heartbeat_at = %s, running = %s, done = %s, failed = %s, "
                "claim_p99 = %s WHERE id = %s",
                [now, json.dumps(list(running)[:RUNNING_MAX]), done, failed, claim_p99, self.id],
            )
            if c.rowcount > 0:
                return True
        logger.warning("worker %s: its row in rws_workers was gone; registered again", self.id)
        self.register(store, now, running, done, failed)
        return False

    def remove(self, store: Any) -> None:
        with store.writes, store.cursor() as c:
            c.execute("DELETE FROM rws_workers WHERE id = %s", [self.id])


def forget_dead(store: Any, now: int) -> int:
    """Delete the rows of workers whose last heartbeat is FORGET_AFTER seconds old."""
    with store.writes, store.cursor() as c:
        c.execute("DELETE FROM rws_workers WHERE heartbeat_at < %s", [now - FORGET_AFTER])
        return c.rowcount


def workers(*, using: str | None = None, now: int | None = None) -> list[Any]:
    """The live workers (heartbeat at most DEAD_AFTER intervals old), by host and start time."""

    alias = queue_alias(using)
    now = int(clock.now(alias)) if now is None else now
    rows = Worker.objects.using(alias).order_by("host", "started_at", "id")
    return [w for w in rows if w.alive(now)]
