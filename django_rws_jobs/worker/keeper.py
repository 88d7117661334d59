"""The lease keeper: renews the leases of the jobs a worker holds, takes back expired ones."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import Error as DatabaseError
from django.db import connections

from ..api.cancellation import prune_cancelled
from ..api.enqueue_once import prune_windows
from ..attempts.outcomes import recover
from ..conf import jobs_settings
from ..database import clock
from ..database.connections import is_transient
from ..operations import metrics
from ..operations.worker_rows import Registration, forget_dead, heartbeat_interval
from ..queue.store import Claimed
from ..tasks.prune import prune_expired
from ..workflows import batch_upkeep, dependency_outcomes
from .reconnect import Connection, Retry
from .shared import Shared

logger = logging.getLogger("django_rws_jobs")


#: Seconds between the keeper's readings of the database's clock (clock.py keeps the others' time).
CLOCK_EVERY = clock.REFRESH / 2


class LeaseKeeper:
    """Every third of LEASE_SECONDS, renew the leases of held jobs (each try once: the next round
    tries again, long before the lease runs out); every RECOVERY_INTERVAL, take back the jobs of
    lost workers and prune task results past their retention (tasks/prune.py). It runs until
    ``done`` is set, after the completer recorded the last outcomes
    (tests/test_worker.py::test_sigterm_lets_the_running_job_finish_and_exits_0). Each round is
    a turn (shared.progress)."""

    ROLE = "rws-keeper"

    def __init__(self, shared: Shared, registration: Registration | None = None):
        self.shared = shared
        self.registration = registration  # this worker's row in rws_workers, renewed each round
        self.done = threading.Event()
        self.holder = shared.bookkeeping
        self.db = Retry(self.holder, shared.stop)
        self.lease = int(jobs_settings.LEASE_SECONDS)
        self.next_recovery = time.monotonic() + jobs_settings.recovery_interval
        self.next_clock = time.monotonic() + CLOCK_EVERY
        self.warned_offset: float | None = None  # see clock.warn_if_off
        self.lease_ends: dict[str, int] = {}  # claim token -> its lease's end, as last renewed
        self.lapsed: set[tuple[str, str]] = set()  # (token, job id) whose lapse was logged
        self.prune_edges_after = ""  # where the next pass of dependency_outcomes.prune starts

    def loop(self) -> None:
        try:
            while not self.done.wait(heartbeat_interval()):
                self.run_once()
        finally:
            self.holder.close()
            connections.close_all()

    def run_once(self) -> None:
        self.shared.progress.turn(self.ROLE)
        with self.shared.held_lock:
            held = list(self.shared.held.values())
        tokens = sorted({job.token for job in held})
        try:
            if tokens:
                self._renew(tokens)
            if self.registration is not None:
                self._beat(held)
            if time.monotonic() >= self.next_clock:
                reading = self.db.once(lambda c: clock.read(c.connection()), "reading the database's clock")
                self.warned_offset = clock.warn_if_off(reading, self.warned_offset)
                self.next_clock = time.monotonic() + CLOCK_EVERY
            if time.monotonic() >= self.next_recovery and not self.shared.stop.is_set():
                self.db.once(lambda c: recover(c.store()), "recovering expired leases")
                self.db.once(lambda c: self._tidy(c.store()), "tidying workers and cancelled jobs")
                self.db.once(self._prune_task_results, "pruning task results")
                self.next_recovery = time.monotonic() + jobs_settings.recovery_interval
        except DatabaseError as exc:
            if not is_transient(exc):
                self.shared.fail(exc, "renewing leases")
            # else logged by Retry; the next round tries again
        except Exception:
            logger.exception("lease keeper error")
        finally:
            self._report_lapsed(held)

    def _prune_task_results(self, holder: Connection) -> None:
        """django.tasks results past their retention (through the ORM, on this connection)."""
        with holder.registered():
            prune_expired(self.shared.alias)

    def _tidy(self, store: Any) -> None:
        """Delete dead workers' rows after an hour, and cancelled jobs past their retention;
        repair the batches a crash left and prune the ended ones past their retention, and the
        dependency rows of jobs that are gone; delete throttle windows that have passed."""
        now = int(clock.now(self.shared.alias))
        batch_retention = float(jobs_settings.BATCH_RETENTION)

        def prune_edges() -> None:
            self.prune_edges_after = dependency_outcomes.prune(store, self.prune_edges_after)

        steps: list[tuple[str, Callable[[], object]]] = [
            ("deleting dead workers' rows", lambda: forget_dead(store, now)),
            (
                "pruning cancelled jobs",
                lambda: prune_cancelled(store, now, float(jobs_settings.CANCELLED_RETENTION)),
            ),
            ("sweeping batches", lambda: batch_upkeep.sweep(store, now)),
            ("sweeping dependencies", lambda: batch_upkeep.sweep_dependencies(store, now)),
            ("pruning dependency rows", prune_edges),
            ("pruning batches", lambda: batch_upkeep.prune(store, now, batch_retention)),
            ("pruning metrics", lambda: metrics.prune(store, now - int(jobs_settings.METRICS_RETENTION))),
            ("pruning throttle windows", lambda: prune_windows(store, now)),
        ]
        # A step that fails for a reason of its own (a value the database refuses) is logged and
        # the others run: it never stops the worker. One that may pass is raised, and the next
        # round tries again (tests/test_batch_workers.py
        # test_a_batch_whose_finish_fails_never_stops_a_worker_nor_its_sweeps).
        for what, step in steps:
            try:
                step()
            except Exception as exc:
                if isinstance(exc, DatabaseError) and is_transient(exc):
                    raise
                logger.exception("lease keeper: %s failed; the other steps go on", what)

    def _beat(self, held: list[Claimed]) -> None:
        """Renew this worker's row: the queue's time, the jobs it holds, its counts, its claims'
        99th percentile since the last renewal (tests/test_workers.py)."""
        registration, stats = self.registration, self.shared.stats
        assert registration is not None
        running = sorted({job.id for job in held})
        claim_p99 = stats.claim_p99()
        self.db.once(
            lambda c: registration.beat(
                c.store(),
                int(clock.now(self.shared.alias)),
                running,
                stats.done,
                stats.retried + stats.dead,
                claim_p99,
            ),
            "renewing the worker's row",
        )

    def _renew(self, tokens: list[str]) -> None:
        now = int(clock.now(self.shared.alias))
        until = now + self.lease
        for token in tokens:
            # A claim first seen here was made at most one round ago: its lease ends no earlier.
            self.lease_ends.setdefault(token, now + self.lease - int(self.lease / 3) - 1)
        self.db.once(lambda c: c.store().renew(tokens, until), "renewing leases")
        for token in tokens:
            self.lease_ends[token] = until

    def _report_lapsed(self, held: list[Claimed]) -> None:
        """Log once per job (ERROR) a lease that ran out before it could be renewed: another
        worker may take the job over, and this worker's outcome is then dropped (fenced on the
        claim). Pinned by tests/test_dead_connections.py (the partition test)."""
        live = {job.token for job in held}
        for token in [t for t in self.lease_ends if t not in live]:
            del self.lease_ends[token]
        self.lapsed &= {(job.token, job.id) for job in held}
        now = clock.now(self.shared.alias)
        for job in held:
            end = self.lease_ends.get(job.token)
            if end is not None and now >= end and (job.token, job.id) not in self.lapsed:
                self.lapsed.add((job.token, job.id))
                logger.error(
                    "job %s (%s): its lease ran out at %s before this worker could renew it; "
                    "another worker may run it, and this worker's outcome will then be dropped",
                    job.id,
                    job.job_type,
                    clock.iso(end),
                )
