"""The scheduler: ticks the cron schedules once a second."""

from __future__ import annotations

import logging
import threading
import time

from django.db import Error as DatabaseError
from django.db import connections

from ..database import clock
from ..schedules.declared import Schedule, valid_schedules
from ..schedules.ticks import tick_schedules
from .reconnect import Connection, Retry
from .shared import Progress

logger = logging.getLogger("django_rws_jobs")

#: Seconds between the INFO lines that count the schedules' enqueues.
COUNT_EVERY = 60.0


class Scheduler:
    """Tick the schedules just after each second starts until ``stop`` is set (at least once).

    Each tick is tried once: ``tick_schedules`` logs a database error per schedule, and the next
    second tries again, on a new connection if the error left the old one unusable
    (tests/test_schedules.py::test_the_scheduler_thread_reconnects_after_losing_its_connection).
    """

    ROLE = "rws-scheduler"

    def __init__(
        self,
        stop: threading.Event,
        alias: str,
        progress: Progress | None = None,
        holder: Connection | None = None,
    ):
        """``holder``: the connection to tick on (a worker's bookkeeping one); by default this
        thread's Django connection."""
        self.stop = stop
        self.alias = alias
        self.db = Retry(Connection(alias, private=False) if holder is None else holder, stop)
        self.progress = Progress() if progress is None else progress  # each tick a turn
        self.enqueued = 0  # since the last count logged (count)
        self.next_count = time.monotonic() + COUNT_EVERY

    def loop(self) -> None:
        schedules = valid_schedules()
        if not schedules:
            with self.progress.waiting(self.ROLE):
                self.stop.wait()  # stay alive: the worker restarts a scheduler thread that returns early
            return
        logger.info(
            "scheduler running %d schedule(s): %s", len(schedules), ", ".join(s.name for s in schedules)
        )
        try:
            while True:
                self.progress.turn(self.ROLE)
                self.count(self.run_once(schedules), time.monotonic())
                if self.stop.wait(1.0 - (clock.now(self.alias) % 1.0) + 0.005):
                    break
        finally:
            connections.close_all()

    def count(self, enqueued: int, at: float) -> None:
        """Add up the jobs the schedules enqueued (each one is logged at DEBUG: ticks.py) and log
        their number at INFO at most once a minute, when there were any
        (tests/test_schedules.py::test_the_scheduler_counts_its_enqueues_once_a_minute)."""
        self.enqueued += enqueued
        if at < self.next_count:
            return
        if self.enqueued:
            logger.info("schedules enqueued %d job(s) in the last minute", self.enqueued)
        self.enqueued, self.next_count = 0, at + COUNT_EVERY

    def run_once(self, schedules: list[Schedule], now: int | None = None) -> int:
        """Enqueue the due jobs of ``schedules``; return how many."""
        try:
            return self.db.once(lambda c: self._tick(c, now, schedules), "ticking the schedules")
        except DatabaseError:
            return 0  # logged by Retry; the next second tries again

    def _tick(self, holder: Connection, now: int | None, schedules: list[Schedule]) -> int:
        with holder.registered() as conn:
            return tick_schedules(now, using=conn.alias, schedules=schedules)
