"""Recording an attempt's outcome, fenced by its claim: success (the row deleted), failure (a retry
after its backoff, or the dead-letter list once the retries are spent), cancelled, what its
handler decided (a snooze, a retry after a delay, a failure for good, a cancel: decisions.py
makes those outcomes), and a lost worker's jobs taken back when their lease expired
(``recover``). ``record`` decides which from what the attempt returned; ``record_or_fallback``
makes sure a value the database refuses still ends the attempt. Pinned by
tests/test_dead_letters.py, tests/test_cancel.py, tests/test_outcomes.py and tests/test_faults.py."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from asgiref.sync import async_to_sync
from django.db import Error as DatabaseError
from django.db import transaction

from ..api.cancellation import send_cancelled
from ..conf import jobs_settings
from ..database import clock
from ..database.connections import is_registered, is_transient
from ..exceptions import cancel_message
from ..flow.concurrency_keys import keys_of, promote
from ..queue.backoff import backoff_delay, jittered
from ..queue.registry import registry
from ..queue.store import Claimed, Store
from ..signals import job_dead
from ..workflows.batch_outcomes import settle

logger = logging.getLogger("django_rws_jobs")

#: Recorded as last_error when recovery takes a job back from a worker that stopped renewing.
WORKER_LOST = "worker lost: the lease of {token!r} expired while the job was running"


def retry_at(attempts: int, now: float | None = None, delay: float | None = None) -> int:
    """The unix second at which the retry becomes due: rounded up, so it never runs early.
    ``delay``: seconds decided already (a Retry's, or the type's backoff, spread); else RWS_JOBS's
    backoff, spread by BACKOFF_JITTER (queue/backoff.py)."""
    now = clock.now() if now is None else now
    if delay is None:
        delay = jittered(backoff_delay(attempts), float(jobs_settings.BACKOFF_JITTER))
    return math.ceil(now + delay)


#: The most characters of an error message (last_error) and of a traceback that are stored. A
#: rust-web-server-created table's last_error is a MySQL TEXT of 65,535 bytes: 16,000 characters of up to 4
#: bytes each fit it.
ERROR_MAX = 16_000
TRACEBACK_MAX = 64_000


def storable(text: str, limit: int, *, keep_end: bool = False) -> str:
    """``text`` as every database can store it: a NUL (which PostgreSQL's text cannot hold) and a
    lone surrogate (which no driver can encode) written as their escapes, at most ``limit``
    characters, the middle cut out when ``keep_end`` (a traceback's last lines name the error).
    Pinned by tests/test_faults.py::test_an_error_text_no_database_can_store_is_recorded."""
    text = text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) <= limit:
        return text
    width = len(str(len(text)))  # the marker counts in its own length: the result fits the limit
    keep = limit - len(f"\n[... {'0' * width} characters cut ...]\n")
    marker = f"\n[... {len(text) - keep} characters cut ...]\n"
    if keep_end:
        head = keep // 4
        return text[:head] + marker + text[len(text) - (keep - head) :]
    return text[:keep] + marker


def describe(exc: BaseException) -> str:
    """What last_error records for a failure: the exception type and message."""
    try:
        message = str(exc)
    except Exception as str_failed:  # an exception whose __str__ raises still fails the job
        message = f"(its message could not be read: {type(str_failed).__name__})"
    return storable(f"{type(exc).__name__}: {message}", ERROR_MAX)


class Cancelled(str):
    """An executor's outcome for a run that it stopped, or did not start, because a cancel was
    requested: the text that last_error records. ``record`` ends a job cancelled for this type of
    outcome, or for any failure once the row carries a request, never for an error's text: a
    handler's own exception that reads ``JobCancelled: ...`` is a failure like any other
    (tests/test_cancel.py::test_an_error_named_job_cancelled_without_a_request_is_an_ordinary_failure)."""

    __slots__ = ()
    #: Whether the handler ran (and was stopped): False for CancelledUnrun.
    ran = True
    #: Whether someone asked for it (the row carries the request): False for CancelledByHandler.
    requested = True


class Snoozed(str):
    """The outcome of a handler that raised ``Snooze``: the text says so for the log; the job is
    due again after ``seconds``, its attempt not charged (``Store.snooze``)."""

    seconds: float

    def __new__(cls, text: str, seconds: float) -> Snoozed:
        made = super().__new__(cls, text)
        made.seconds = seconds
        return made

    def __reduce__(self) -> tuple[Any, ...]:  # the process pool's child sends it to its parent
        return (Snoozed, (str(self), self.seconds))


class Interrupted(str):
    """The outcome of a handler stopped by JobInterrupted (``iterate`` at the worker's stop, or
    the handler's own): the job goes back to the queue unchanged but for ``resumptions`` (its
    attempt not charged), and resumes from its checkpoint (``Store.release``)."""

    __slots__ = ()


class Failure(str):
    """A failed attempt whose handler or job type decided more than RWS_JOBS's backoff: ``delay``
    seconds before the retry (a Retry's, exact; the type's backoff, spread), or ``dead`` (Fail,
    ``fail_on``): the dead-letter list now. The text is last_error, as a plain failure's."""

    delay: float | None
    dead: bool

    def __new__(cls, text: str, delay: float | None = None, dead: bool = False) -> Failure:
        made = super().__new__(cls, text)
        made.delay, made.dead = delay, dead
        return made

    def __reduce__(self) -> tuple[Any, ...]:
        return (Failure, (str(self), self.delay, self.dead))


class CancelledByHandler(Cancelled):
    """The outcome of a handler that raised ``Cancel``: the job ends cancelled, asked or not."""

    __slots__ = ()
    requested = False


class CancelledUnrun(Cancelled):
    """The outcome of a job whose handler never started: it carried a cancel request when it was
    claimed (asked_to_cancel)."""

    __slots__ = ()
    ran = False


def record(store: Store, job: Claimed, error: Any, tb: str | None, expired_before: int | None = None) -> str:
    """Write the outcome, fenced on the claim; return what happened ('done', 'retry', 'dead',
    'cancelled', 'snoozed', 'interrupted', 'lost').

    A row runner's row (a django.tasks row) is recorded by its runner, a failure and recovery's
    error text included (tests/test_tasks_worker.py)."""
    if isinstance(error, Cancelled):
        if record_cancel(store, job, error, tb, expired_before):
            return "cancelled"
        error = str(error)  # the row carries no request (or the claim is gone): what it is, a failure
    if isinstance(error, Interrupted) and expired_before is None:
        if store.release(job, resumed=True):
            logger.info(
                "job %s (%s) handed back: %s; it resumes from its checkpoint", job.id, job.job_type, error
            )
            return "interrupted"
        if record_cancel(store, job, None, None):
            return "cancelled"  # its cancel was requested: it does not go back to the queue
        return _lost(job, "interrupted")
    if error is not None:
        rows = registry.row_runner(job.job_type)
        if rows is not None:
            return rows.record(store, job, error, expired_before)  # a cancel included (outcomes.py)
    if error is None:
        applied, outcome = store.complete(job), "done"
    elif isinstance(error, Snoozed):
        applied, outcome = record_snooze(store, job, error, expired_before), "snoozed"
    else:
        decided = error if isinstance(error, Failure) else None
        error = storable(error, ERROR_MAX)
        tb = None if tb is None else storable(tb, TRACEBACK_MAX, keep_end=True)
        now = clock.now(store.conn.alias)
        applied, outcome = _record_failure(store, job, error, tb, now, expired_before, decided)
    if not applied:
        if outcome != "done" and record_cancel(store, job, None, None, expired_before):
            return "cancelled"  # failed (or its worker was lost) after a cancel was requested
        return _lost(job, outcome)
    return outcome


def _lost(job: Claimed, outcome: str) -> str:
    logger.warning(
        "job %s (%s): result %r dropped: claim %s no longer holds it "
        "(its lease expired and another worker took it over)",
        job.id,
        job.job_type,
        outcome,
        job.token,
    )
    return "lost"


def record_cancel(
    store: Store, job: Claimed, error: str | None, tb: str | None, expired_before: int | None = None
) -> bool:
    """End a held job whose cancel was requested as cancelled (fenced; False if none was
    requested or the claim is gone), and send job_cancelled once committed. The log says how it
    ended: stopped (or failed, or handed back) while it ran, taken back from a lost worker, or
    never run
    (tests/test_cancel.py::test_a_request_a_rust_retry_kept_is_carried_out_before_the_handler_runs)."""
    now = int(clock.now(store.conn.alias))
    if isinstance(error, Cancelled) and not error.ran:
        how = "before its handler ran: it carried the request when it was claimed"
    elif isinstance(error, Cancelled) and not error.requested:
        how = "by its handler (Cancel)"
    elif expired_before is not None:
        how = "when its lease expired (its worker was lost)"
    else:
        how = "while it ran"
    if error is None:
        error = cancel_message(None, running=True)
    requested = not isinstance(error, Cancelled) or error.requested
    if not store.cancel_running(job, error, tb, now, expired_before, requested=requested):
        return False
    logger.warning("job %s (%s) cancelled %s", job.id, job.job_type, how)
    cancelled = job.as_job(status="cancelled", cancelled_at=now, last_error=error, traceback=tb)
    if is_registered(store.conn):  # tick() inside the caller's transaction: after it commits
        transaction.on_commit(lambda: send_cancelled(cancelled), using=store.conn.alias)
    else:
        send_cancelled(cancelled)
    return True


def record_snooze(store: Store, job: Claimed, snoozed: Snoozed, expired_before: int | None) -> bool:
    """Put a snoozed job back in the queue, due after its snooze, its attempt not charged."""
    due = math.ceil(clock.now(store.conn.alias) + snoozed.seconds)
    applied = store.snooze(job, due, expired_before)
    if applied:
        logger.info("job %s (%s) snoozed until %s", job.id, job.job_type, clock.iso(due))
    return applied


def _record_failure(
    store: Store,
    job: Claimed,
    error: str,
    tb: str | None,
    now: float,
    expired_before: int | None,
    decided: Failure | None = None,
) -> tuple[bool, str]:
    """Retry the failed job after its backoff (or the delay its handler or type ``decided``), or
    move it to the dead-letter list once its retries are spent or it ``decided`` so (sending
    job_dead): (applied, 'retry' or 'dead')."""
    attempts = job.attempts + 1
    if attempts <= job.max_retries and not (decided is not None and decided.dead):
        due = retry_at(attempts, now, None if decided is None else decided.delay)
        applied = store.reschedule(job, attempts, error, tb, due, expired_before)
        outcome = "retry"
        if applied:
            _log_failure(logging.WARNING, job, attempts, error, tb, f"will retry at {clock.iso(due)}")
    else:
        applied = store.move_to_dead_letters(job, attempts, error, tb, int(now), expired_before)
        outcome = "dead"
        if applied:
            _log_failure(logging.ERROR, job, attempts, error, tb, "moved to the dead-letter list")
            dead = job.as_job(
                status="failed", attempts=attempts, last_error=error, traceback=tb, failed_at=int(now)
            )
            if is_registered(store.conn):  # tick() inside the caller's transaction: after it commits
                transaction.on_commit(lambda: send_dead(dead), using=store.conn.alias)
            else:
                send_dead(dead)
    return applied, outcome


def _log_failure(level: int, job: Claimed, attempts: int, error: str, tb: str | None, then: str) -> None:
    """Say why an attempt failed, on every attempt: the error's first line (an unregistered job
    type's included), and its traceback on the last attempt or at DEBUG (``rws_worker -v 2``).
    Pinned by tests/test_worker.py::test_the_log_says_why_a_job_failed_and_which_clock_decides."""
    if not logger.isEnabledFor(level):
        return
    first = error.split("\n", 1)[0]
    of = job.max_retries + 1
    message = f"job {job.id} ({job.job_type}) failed on attempt {attempts} of {of}: {first}; {then}"
    if tb and (level >= logging.ERROR or logger.isEnabledFor(logging.DEBUG)):
        message += "\n" + tb.rstrip("\n")
    logger.log(level, "%s", message)


def send_dead(job: Any) -> None:
    """Send job_dead to each receiver in turn. Whatever a receiver raises, even SystemExit, is
    logged and stops neither the other receivers nor the caller (the worker's completer, tick()).
    Pinned by tests/test_faults.py::test_a_job_dead_receiver_cannot_stop_the_worker."""
    sync_receivers, async_receivers = job_dead._live_receivers(type(job))
    calls = [*sync_receivers, *(async_to_sync(r) for r in async_receivers)]
    for receiver in calls:
        try:
            receiver(signal=job_dead, sender=type(job), job=job)
        except BaseException:
            logger.exception("job_dead receiver %r raised for job %s", receiver, job.id)


def record_or_fallback(
    call: Callable[[Callable[[Store], str]], str], job: Claimed, error: Any, tb: str | None
) -> str:
    """Record an outcome through ``call`` (which runs a Store operation, retrying what may pass).

    A failure the database refuses to store for good (a value it rejects) is recorded again with
    its message as plain ASCII and no traceback, so that the job still reaches its retry or the
    dead-letter list instead of running on until its lease expires. Pinned by
    tests/test_faults.py::test_an_outcome_the_database_refuses_is_recorded_plainly.
    """
    try:
        return call(lambda s: record(s, job, error, tb))
    except DatabaseError as exc:
        if not isinstance(error, str) or is_transient(exc):
            raise
        logger.error(
            "job %s (%s): the database refused its outcome (%s); recording it as plain text",
            job.id,
            job.job_type,
            exc,
        )
        plain = error.encode("ascii", "backslashreplace").decode("ascii")
        return call(lambda s: record(s, job, plain, None))


def asked_to_cancel(job: Claimed) -> bool:
    """Whether a job that was just claimed carries a cancel request already: its handler is not
    run, the job ends cancelled (``record`` of a ``CancelledUnrun`` outcome).

    A rust-web-server worker puts a job back in the queue (retried: pending again, attempts + 1;
    or reset at its start-up, no attempt added) without knowing of ``cancel_requested_at``, so a
    request that reached the job while the crate ran it, never carried out, is still on the row
    when one of our workers claims the job
    (tests/test_cancel.py::test_a_worker_ends_a_rust_retried_cancel_request_without_running_it).
    Our own writes never put a job whose cancel was requested back in the queue (Store.fenced).
    The claim returns the column with the job (CLAIM_COLUMNS): no read of its own."""
    return job.cancel_requested_at is not None


def recover(store: Store, now: int | None = None, limit: int = 100) -> int:
    """Take back running jobs whose lease expired, charging each an attempt.

    Rows with no lease at all (a rust-web-server writer's) first get one, and are taken back only if it runs
    out: the Rust worker that holds them may be alive. Returns how many jobs were taken back.
    """
    now = int(clock.now(store.conn.alias)) if now is None else now
    lease = int(jobs_settings.LEASE_SECONDS)
    store.lease_leaseless(now, now + lease)
    store.refresh_rust_claims(now, now + lease)
    taken = 0
    freed: list[str] = []  # the keys whose slots the recovered jobs held
    while True:
        expired = store.expired(now, limit)
        batch = 0
        ended = []
        for job in expired:
            error = WORKER_LOST.format(token=job.token)
            result = record(store, job, error, None, expired_before=now)
            if result != "lost":
                batch += 1
                freed += keys_of([job])
                ended.append((job, result))
                logger.warning("job %s (%s) recovered: %s", job.id, job.job_type, error)
        settle(store, ended, now)
        taken += batch
        if len(expired) < limit or batch == 0:
            if freed:
                promote(store, freed, now)
            return taken
