"""The completer: records the executors' outcomes, the finished jobs in batches."""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable
from typing import Any

from django.db import Error as DatabaseError
from django.db import close_old_connections, connections

from ..attempts.outcomes import record_or_fallback
from ..conf import jobs_settings
from ..database import clock
from ..flow.concurrency_keys import keys_of, promote
from ..operations.metrics import FLUSH_EVERY, write
from ..queue.registry import registry
from ..queue.store import Claimed, Store
from ..workflows.batch_outcomes import settle
from .reconnect import Connection, Retry
from .shared import Outcome, Shared, outcomes

logger = logging.getLogger("django_rws_jobs")


class Completer:
    """Record outcomes from ``shared.results`` until it gives None.

    Each batch is whatever arrived while the last one was written; finished jobs are deleted in
    one statement. An outcome is retried while its lease may still be ours; after that, recovery
    runs the job again (tests/test_faults.py). Each batch is a turn (shared.progress).
    """

    ROLE = "rws-completer"

    def __init__(self, shared: Shared):
        self.shared = shared
        self.holder = Connection(shared.alias)
        self.db = Retry(self.holder, shared.stop)
        self.next_flush = time.monotonic() + FLUSH_EVERY

    def loop(self) -> None:
        try:
            while self.run_once():
                pass
        finally:
            self.holder.close()
            connections.close_all()

    def run_once(self) -> bool:
        """Record one batch, and the counters at most every FLUSH_EVERY seconds; False when
        told to stop (the counters written last)."""
        self.shared.progress.turn(self.ROLE)
        try:
            batch = [self.shared.results.get(timeout=FLUSH_EVERY)]
        except queue.Empty:
            batch = []
        while True:
            try:
                batch.append(self.shared.results.get_nowait())
            except queue.Empty:
                break
        items = [b for b in batch if b is not None]
        if items:
            self.record(items)
            close_old_connections()  # job_dead receivers may have used Django's connection
        going_on = len(items) == len(batch)
        if not going_on or time.monotonic() >= self.next_flush:
            self.flush(final=not going_on)
        return going_on

    def flush(self, final: bool = False) -> None:
        """Write the counters (metrics.py); ones that fail are kept for the next write."""
        self.next_flush = time.monotonic() + FLUSH_EVERY
        rows = self.shared.counters.take(clock.now(self.shared.alias), time.monotonic())
        if not rows:
            return
        try:
            if final:
                self.db.until(time.monotonic() + 5, lambda c: write(c.store(), rows), "writing the counters")
            else:
                self.db.once(lambda c: write(c.store(), rows), "writing the counters")
        except Exception as exc:  # counters are not worth a job: kept for the next try
            logger.warning("could not write the metrics counters: %s", exc)
            if not final:
                self.shared.counters.give_back(rows)

    def record(self, items: list[Outcome]) -> None:
        """Record ``items``, then promote the keys whose slots they freed and settle their
        batches and dependents. The jobs are held until all of that is written, so that a
        ``--burst`` dispatcher never sees nothing due and nothing held while a job they release
        is on its way (tests/test_batch_workers.py::test_a_burst_worker_runs_a_whole_chain)."""
        try:
            self._record(items)
        finally:
            self.shared.let_go([job for job, _, _ in items])

    def _record(self, items: list[Outcome]) -> None:
        deadline = time.monotonic() + float(jobs_settings.LEASE_SECONDS)
        ended: list[tuple[Claimed, str]] = []
        try:
            succeeded = [job for job, error, _ in items if error is None]
            if succeeded:
                done = self.db.until(
                    deadline, lambda c: c.store().complete_many(succeeded), "recording finished jobs"
                )
                ended += zip(succeeded, outcomes(succeeded, done), strict=True)
            others: list[Outcome] = [(job, error, tb) for job, error, tb in items if error is not None]
            if others:
                ended += self._record_others(deadline, others)
        except DatabaseError as exc:
            logger.error(
                "could not record %d job outcome(s): %s; their leases will expire and "
                "another worker will run them again",
                len(items),
                exc,
            )
        except Exception:  # a bug must not kill the completer with every later outcome waiting
            logger.exception(
                "could not record %d job outcome(s); their leases will expire and "
                "another worker will run them again",
                len(items),
            )
        jobs, results = zip(*ended, strict=True) if ended else ((), ())
        self.shared.stats.add(results)
        self.shared.counters.ended(jobs, results)
        keys = keys_of(job for job, _, _ in items)
        if keys:
            self._promote(deadline, keys)
        settle_batches(self.db, deadline, self.shared, ended)

    def _promote(self, deadline: float, keys: list[str]) -> None:
        """Promote the next jobs of the keys whose slots this batch freed; one that fails is left
        to the sweeps (concurrency_keys.py)."""
        try:
            promoted = self.db.until(
                deadline, lambda c: promote(c.store(), keys, int(clock.now(self.shared.alias))), "promoting"
            )
        except Exception:
            logger.exception("could not promote the waiting jobs of %d concurrency key(s)", len(keys))
            return
        if promoted:
            self.shared.due_now()  # this process's dispatcher may claim them at once

    def _record_others(self, deadline: float, items: list[Outcome]) -> list[tuple[Claimed, str]]:
        """Failures one by one; the rows of a row runner that records many at once (the
        django.tasks rows: tasks/rows.py), in one call of it per batch. Each job with what
        became of it."""
        results: list[tuple[Claimed, str]] = []
        batched: dict[int, tuple[Callable[..., list[str]], list[tuple[Claimed, Any]]]] = {}
        for job, error, tb in items:
            runner = None if isinstance(error, str) else registry.row_runner(job.job_type)
            record_many = getattr(runner, "record_many", None)
            if record_many is None:
                results.append((job, self._record_failure(deadline, job, error, tb)))
            else:
                batched.setdefault(id(runner), (record_many, []))[1].append((job, error))
        for record_many, pairs in batched.values():

            def record(c: Connection, f: Callable[..., list[str]] = record_many, p: Any = pairs) -> list[str]:
                return f(c.store(), p)

            try:
                results += zip(
                    [job for job, _ in pairs], self.db.until(deadline, record, "recording tasks"), strict=True
                )
            except Exception:
                logger.exception(
                    "could not record %d task outcome(s); their leases will expire and another "
                    "worker will run them again",
                    len(pairs),
                )
                results += [(job, "lost") for job, _ in pairs]
        return results

    def _record_failure(self, deadline: float, job: Claimed, error: Any, tb: str | None) -> str:
        """Record one failure; one that cannot be recorded is logged and dropped (its lease
        expires and recovery runs the job again), and the other outcomes go on."""

        def call(fn: Callable[[Store], str]) -> str:
            return self.db.until(deadline, lambda c: fn(c.store()), f"recording job {job.id}")

        try:
            return record_or_fallback(call, job, error, tb)
        except Exception:
            logger.exception(
                "could not record the failure of job %s (%s); its lease will expire and "
                "another worker will run it again",
                job.id,
                job.job_type,
            )
            return "lost"


def settle_batches(db: Retry, deadline: float, shared: Shared, ended: list[tuple[Claimed, str]]) -> None:
    """The batch members among ``ended`` (their rows, their batches' finish) and what waits for
    them (batch_outcomes.settle); the dispatcher is woken when a job was released or a callback
    enqueued. One that fails is logged and left to the keeper's sweeps."""
    if not any(
        job.batch_id is not None or job.has_dependents or result in ("dead", "cancelled")
        for job, result in ended
    ):
        return
    try:
        changed = db.until(
            deadline, lambda c: settle(c.store(), ended, int(clock.now(shared.alias))), "settling batches"
        )
    except Exception:
        logger.exception("could not record the batch outcomes of %d job(s); the sweep will", len(ended))
        return
    if changed:
        shared.due_now()


def record_late_outcomes(shared: Shared) -> None:
    """Record the outcomes of jobs that finished after the completer stopped (the shutdown calls
    it): each job is recorded or handed back, never left running until its lease expires
    (tests/test_worker.py::test_a_job_that_finishes_as_the_completer_stops_is_recorded)."""
    late: list[Outcome] = []
    while True:
        try:
            item = shared.results.get_nowait()
        except queue.Empty:
            break
        if item is not None:
            late.append(item)
    if late:
        completer = Completer(shared)
        try:
            completer.record(late)
        finally:
            completer.holder.close()
