"""The lease keeper: renews the leases of the jobs a worker holds, takes back expired ones."""

from __future__ import annotations

import logging
import threading
import time

from django.db import Error as DatabaseError
from django.db import connections

from ..conf import jobs_settings
from ..db import is_transient
from ..reconnect import Connection, Retry
from ..runner import recover
from ..tasks.prune import prune_expired
from .shared import Shared

logger = logging.getLogger("django_rws_jobs")


class LeaseKeeper:
    """Every third of LEASE_SECONDS, renew the leases of held jobs (each try once: the next round
    tries again, long before the lease runs out); every RECOVERY_INTERVAL, take back the jobs of
    lost workers and prune task results past their retention (tasks/prune.py). It runs until
    ``done`` is set, after the completer recorded the last outcomes
    (tests/test_worker.py::test_sigterm_lets_the_running_job_finish_and_exits_0)."""

    def __init__(self, shared: Shared):
        self.shared = shared
        self.done = threading.Event()
        self.holder = Connection(shared.alias)
        self.db = Retry(self.holder, shared.stop)
        self.lease = int(jobs_settings.LEASE_SECONDS)
        self.next_recovery = time.monotonic() + jobs_settings.recovery_interval

    def loop(self) -> None:
        try:
            while not self.done.wait(max(self.lease / 3, 0.2)):
                self.run_once()
        finally:
            self.holder.close()
            connections.close_all()

    def run_once(self) -> None:
        try:
            with self.shared.held_lock:
                tokens = sorted({token for token, _ in self.shared.held})
            if tokens:
                until = int(time.time()) + self.lease
                self.db.once(lambda c: c.store().renew(tokens, until), "renewing leases")
            if time.monotonic() >= self.next_recovery and not self.shared.stop.is_set():
                self.db.once(lambda c: recover(c.store()), "recovering expired leases")
                prune_expired(self.shared.alias)  # django.tasks results past their retention
                self.next_recovery = time.monotonic() + jobs_settings.recovery_interval
        except DatabaseError as exc:
            if not is_transient(exc):
                self.shared.fail(exc, "renewing leases")
            # else logged by Retry; the next round tries again
        except Exception:
            logger.exception("lease keeper error")
