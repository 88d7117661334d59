"""Run one claimed job and record its outcome; take back jobs whose worker was lost."""

from __future__ import annotations

import logging
import math
import time
import traceback
from typing import Any

from django.db import close_old_connections, connections, transaction

from .conf import jobs_settings
from .db import is_registered, thread_connected
from .registry import registry
from .signals import job_dead
from .store import Claimed, Store

logger = logging.getLogger("django_rws_jobs")

#: Recorded as last_error when recovery takes a job back from a worker that stopped renewing.
WORKER_LOST = "worker lost: the lease of {token!r} expired while the job was running"


def backoff_delay(attempts: int) -> float:
    """Seconds before retry number ``attempts`` (1 for the first): initial * multiplier**(n-1), capped."""
    initial = float(jobs_settings.BACKOFF_INITIAL)
    multiplier = float(jobs_settings.BACKOFF_MULTIPLIER)
    cap = float(jobs_settings.BACKOFF_MAX)
    try:
        delay = initial * multiplier ** (attempts - 1)
    except OverflowError:
        delay = cap
    return min(delay, cap)


def retry_at(attempts: int, now: float | None = None) -> int:
    """The unix second at which the retry becomes due: rounded up, so it never runs early."""
    now = time.time() if now is None else now
    return math.ceil(now + backoff_delay(attempts))


def describe(exc: BaseException) -> str:
    """What last_error records for a failure: the exception type and message."""
    return f"{type(exc).__name__}: {exc}"


def execute(job: Claimed) -> tuple[str | None, str | None]:
    """Call the job's handler outside any transaction; return (error, traceback) or (None, None)."""
    spec = registry.get(job.job_type)
    if spec is None:
        return f"no handler registered for job_type '{job.job_type}'", None
    try:
        spec.func(job.payload)
    except Exception as exc:
        tb = traceback.format_exc()
        logger.error(
            "job %s (%s) failed on attempt %d/%d: %s: %s",
            job.id, job.job_type, job.attempts + 1, job.max_retries + 1, type(exc).__name__, exc,
            exc_info=True,
        )
        return describe(exc), tb
    finally:
        _close_old_connections()
    return None, None


def _close_old_connections() -> None:
    """Django's hygiene after a request, after each job: close connections that are broken or past
    CONN_MAX_AGE. (After, not also before: the thread that runs the next job ran this after the
    last one.) Skipped in a thread that never connected, and inside a transaction (``tick()``
    called in an ``atomic()`` block or a TestCase), where closing would break the caller's work."""
    if thread_connected() and not any(conn.in_atomic_block for conn in connections.all(initialized_only=True)):
        close_old_connections()


def record(store: Store, job: Claimed, error: str | None, tb: str | None,
           expired_before: int | None = None) -> str:
    """Write the outcome, fenced on the claim; return what happened ('done', 'retry', 'dead', 'lost')."""
    now = time.time()
    if error is None:
        applied, outcome = store.complete(job), "done"
    else:
        attempts = job.attempts + 1
        if attempts <= job.max_retries:
            due = retry_at(attempts, now)
            applied = store.reschedule(job, attempts, error, tb, due, expired_before)
            outcome = "retry"
            if applied:
                logger.info("job %s (%s) will retry at %d (attempt %d of %d)",
                            job.id, job.job_type, due, attempts + 1, job.max_retries + 1)
        else:
            applied = store.bury(job, attempts, error, tb, int(now), expired_before)
            outcome = "dead"
            if applied:
                logger.error("job %s (%s) moved to the dead-letter list after %d attempts: %s",
                             job.id, job.job_type, attempts, error)
                dead = job.as_job(status="failed", attempts=attempts, last_error=error, traceback=tb,
                                  failed_at=int(now))
                if is_registered(store.conn):  # tick() inside the caller's transaction: after it commits
                    transaction.on_commit(lambda: send_dead(dead), using=store.conn.alias)
                else:
                    send_dead(dead)
    if not applied:
        logger.warning("job %s (%s): result %r dropped: claim %s no longer holds it "
                       "(its lease expired and another worker took it over)",
                       job.id, job.job_type, outcome, job.token)
        return "lost"
    return outcome


def send_dead(job: Any) -> None:
    """Send job_dead; a receiver that raises is logged and does not stop the caller."""
    for receiver, result in job_dead.send_robust(sender=type(job), job=job):
        if isinstance(result, Exception):
            logger.error("job_dead receiver %r raised for job %s", receiver, job.id,
                         exc_info=(type(result), result, result.__traceback__))


def run_claimed(store: Store, job: Claimed) -> str:
    error, tb = execute(job)
    return record(store, job, error, tb)


def recover(store: Store, now: int | None = None, limit: int = 100) -> int:
    """Take back running jobs whose lease expired, charging each an attempt.

    Rows with no lease at all (a seed writer's) first get one, and are taken back only if it runs
    out: the Rust worker that holds them may be alive. Returns how many jobs were taken back.
    """
    now = int(time.time()) if now is None else now
    lease = int(jobs_settings.LEASE_SECONDS)
    store.lease_leaseless(now, now + lease)
    store.relet_seed_claims(now, now + lease)
    taken = 0
    while True:
        expired = store.expired(now, limit)
        batch = 0
        for job in expired:
            error = WORKER_LOST.format(token=job.token)
            if record(store, job, error, None, expired_before=now) != "lost":
                batch += 1
                logger.warning("job %s (%s) recovered: %s", job.id, job.job_type, error)
        taken += batch
        if len(expired) < limit or batch == 0:
            return taken
