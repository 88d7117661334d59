"""Run one claimed job and record its outcome; take back jobs whose worker was lost."""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from asgiref.sync import async_to_sync
from django.db import Error as DatabaseError
from django.db import close_old_connections, connections, transaction

from ..conf import jobs_settings
from ..database import clock
from ..database.connections import is_registered, is_transient, thread_connected
from ..exceptions import cancel_message
from ..flow.concurrency_keys import keys_of, promote
from ..signals import job_dead
from . import middleware
from .batch_outcomes import settle
from .cancellation import send_cancelled
from .context import current_job, inline, running
from .registry import registry
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
    now = clock.now() if now is None else now
    return math.ceil(now + backoff_delay(attempts))


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


def call_handler(func: Callable[[str], Any], payload: str, is_async: bool, job: Claimed | None = None) -> Any:
    """Run a handler to completion in the calling thread; return what it returned.

    An ``async def`` handler runs on an event loop of its own (``run_async``: ``async_to_sync``,
    as Django runs async views from sync code), where a stop of ``job`` reaches it (AsyncRun).
    Whatever else a handler returns that would have to be awaited or iterated to run its body (a
    coroutine, a generator) fails the job: returning it is not running it. Pinned by
    tests/test_faults.py::test_async_handlers_run_and_generators_fail.
    """
    if is_async:  # JobSpec.is_async
        return run_async(job, func, (payload,), {})
    result = func(payload)
    if result is None:
        return None
    if inspect.isawaitable(result) or inspect.isgenerator(result) or inspect.isasyncgen(result):
        close = getattr(result, "close", None)
        if close is not None and not inspect.isasyncgen(result):
            close()  # no "never awaited" warning: it is reported as this failure instead
        raise TypeError(
            f"the handler {_name(func)} returned {type(result).__name__} {_name(result)} instead of running: "
            "a handler must be a plain function or an async def function, not a generator or one "
            "that returns an awaitable"
        )
    return result


def _name(obj: Any) -> str:
    return getattr(obj, "__qualname__", None) or type(obj).__name__


class Watch:
    """What the executor that runs jobs in a thread learns of each job's handler: ``outcome`` is
    None until the handler has returned, then the run's (error, traceback).

    ``execute`` sets it by a plain attribute store right after the handler returns. CPython looks
    for an asynchronous exception (the thread pool's JobCancelled) and runs signal handlers (the
    process pool child's SIGTERM) at calls and backward jumps, not at a return, so neither lands
    between the return and the store; one that lands later finds the outcome set, and the
    executor keeps that outcome: a handler that finished stays done
    (tests/test_cancel.py::test_a_cancel_that_reaches_a_handler_after_it_returned_leaves_it_done).
    A handler that returns a value (checked by call_handler) counts as returned once it passed.
    A django.tasks task's function marks itself the same way as soon as it returns (a Returned,
    tasks/rows.py run_task), before its value is turned into the result.
    """

    __slots__ = ("aio", "job", "lock", "outcome")

    def __init__(self) -> None:
        # The job it watches: a job that its handler runs by tick() leaves it alone
        # (tests/test_cancel.py::test_a_job_run_inside_a_handler_does_not_mark_the_outer_handler_returned).
        self.job: Claimed | None = None
        self.outcome: tuple[Any, str | None] | None = None
        # The job's async def handler (or task) once it is about to run on its event loop: from
        # then on the executor stops it through this, not in the thread (AsyncRun). Set under
        # ``lock``, which the executor holds when it decides how to stop the job.
        self.aio: AsyncRun | None = None
        self.lock = threading.Lock()  # a plain Lock: entered by C code only

    def start(self, job: Claimed) -> None:
        self.job, self.outcome, self.aio = job, None, None

    def result(self) -> tuple[Any, str | None]:
        """The outcome of a handler that has returned, for an executor whose JobCancelled landed
        after the return: a row runner's (Returned) is built now."""
        assert self.outcome is not None
        error, tb = self.outcome
        if isinstance(error, Returned):
            return error.build(), None
        return error, tb


class Returned:
    """What a row runner stores as its Watch's outcome error as soon as its function has returned,
    before it turns the return value into the outcome (tasks/rows.py): ``build()`` does that, and
    the executor calls it when a JobCancelled raised just before the return lands in the building
    (Watch.result). Building twice gives the same outcome."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value: Any = None  # what the function returned

    def build(self) -> Any:
        raise NotImplementedError


class AsyncRun:
    """An ``async def`` handler or task that a thread runs (``run_async``) on an event loop of its
    own, in a thread of asgiref's, and how a stop reaches it there.

    The calling thread waits in a C call while the coroutine runs, where a JobCancelled raised in
    that thread does not land; ``stop`` cancels the coroutine's asyncio task on its loop instead,
    so asyncio.CancelledError reaches the coroutine at its next await, and the run then raises
    ``stop``'s exception (from that CancelledError) in the calling thread: the executor's
    JobCancelled (tests/test_cancel.py::test_cancelling_a_running_async_handler_stops_it_at_its_await)
    or the watchdog's JobTimeout
    (tests/test_timeouts.py::test_an_async_handler_past_its_limit_is_stopped_at_its_await). A
    stop that comes before the coroutine starts makes the run raise at once, the handler unrun;
    one that comes once the coroutine has returned does nothing: the Watch is marked first, on
    the loop, where no exception or signal handler interrupts (only a process's main thread runs
    signal handlers, and nothing raises in the loop's thread)."""

    __slots__ = ("lock", "loop", "stopping", "task")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task[Any] | None = None
        self.stopping: BaseException | None = None

    def stop(self, exc: BaseException) -> None:
        """Stop the coroutine with ``exc`` (from any thread); the first stop wins."""
        with self.lock:
            if self.stopping is not None:
                return
            self.stopping = exc
            loop, task = self.loop, self.task
        if loop is not None and task is not None:
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # its loop is closed: the coroutine has ended
                pass

    async def run(
        self,
        func: Callable[..., Any],
        args: Sequence[Any],
        kwargs: dict[str, Any],
        handlers: Watch | None,
        returned: Returned | None,
    ) -> Any:
        with self.lock:
            self.loop, self.task = asyncio.get_running_loop(), asyncio.current_task()
            stopping = self.stopping
        if stopping is not None:
            raise stopping
        try:
            value = await func(*args, **kwargs)
        except asyncio.CancelledError as exc:
            if self.stopping is None:
                raise
            raise self.stopping from exc
        if handlers is not None:  # returned: it stays done (Watch)
            if returned is None:
                handlers.outcome = SUCCEEDED
            else:
                returned.value = value
                handlers.outcome = (returned, None)
        return value


def run_async(
    job: Claimed | None,
    func: Callable[..., Any],
    args: Sequence[Any],
    kwargs: dict[str, Any],
    returned: Returned | None = None,
) -> Any:
    """``func(*args, **kwargs)``, a coroutine function, run to its end from the calling thread
    (``async_to_sync``). When the thread's Watch watches ``job``, its executor stops the run
    through an AsyncRun, which also marks the Watch once the coroutine has returned (with
    ``returned`` for a row runner)."""
    handlers = None if job is None else watching(job)
    if job is not None and inline.get():
        # tick() claimed the job inside the caller's transaction: only this thread's connection
        # sees its row, and the event loop cannot use it. What the handler may read is read now
        # (tests/test_batches.py::test_an_async_handler_ticked_inside_a_transaction_names_the_twins).
        context = current_job()
        if context is not None:
            context._preload()
    run = AsyncRun()
    if handlers is not None:
        # A JobCancelled the executor raised in this thread before this lands at the lock's
        # release at the latest (a call), before the coroutine exists; after it, the executor
        # stops the coroutine through ``run``.
        with handlers.lock:
            handlers.aio = run
    return async_to_sync(run.run)(func, args, kwargs, handlers, returned)


#: A handler's success, as Watch.outcome and execute return it.
SUCCEEDED: tuple[Any, str | None] = (None, None)

_watches = threading.local()


def watch(handlers: Watch | None) -> None:
    """Make ``handlers`` the Watch of the jobs that ``execute`` runs in the calling thread."""
    _watches.current = handlers


def watching(job: Claimed) -> Watch | None:
    """The calling thread's Watch if it watches ``job``, else None."""
    handlers: Watch | None = getattr(_watches, "current", None)
    return handlers if handlers is not None and handlers.job is job else None


def execute(job: Claimed) -> tuple[Any, str | None]:
    """Call the job's handler outside any transaction; return (error, traceback) or (None, None).

    A row no handler serves but a row runner does (a django.tasks row) returns that runner's
    outcome as its error, which ``record`` hands back to the runner. The thread's Watch (if any)
    gets the outcome as soon as the handler has returned."""
    handlers = watching(job)
    spec = registry.get(job.job_type)
    if spec is None:
        rows = registry.row_runner(job.job_type)
        if rows is not None:
            token = running.set(job)  # current_job() in the task's function
            outcome: Any = None
            ran = False
            try:
                outcome = rows.run(job)
                ran = True
            finally:
                running.reset(token)
                if job.context is not None:
                    # A failed or stopped attempt keeps its last progress, as a handler's does
                    # (tests/test_reports.py::test_a_failed_tasks_attempt_keeps_its_last_progress).
                    try:
                        job.context._end(failed=not ran or rows.failed(outcome))
                    except Exception as unsaved:
                        logger.warning("task %s: its metadata was not saved: %s", job.id, unsaved)
                    job.context = None  # no cycle (the context holds the claim)
            if handlers is not None:
                handlers.outcome = (outcome, None)
            return outcome, None
        return f"no handler registered for job_type '{job.job_type}'", None
    token = running.set(job)  # current_job() in the handler
    try:
        executors = middleware.chains()[1]
        if executors:
            middleware.around(
                executors, current_job(), lambda: call_handler(spec.func, job.payload, spec.is_async, job)
            )
        else:
            call_handler(spec.func, job.payload, spec.is_async, job)
        if job.context is not None:  # the handler asked for current_job(): save what it changed
            job.context._end()
        if handlers is not None:
            handlers.outcome = SUCCEEDED
    except Exception as exc:
        if job.context is not None and not job.context._ended:
            try:
                job.context._end(failed=True)
            except Exception as unsaved:
                logger.warning("job %s: its metadata was not saved: %s", job.id, unsaved)
        tb = storable(traceback.format_exc(), TRACEBACK_MAX, keep_end=True)
        return describe(exc), tb  # logged where it is recorded (_record_failure)
    except BaseException:
        # JobTimeout, JobCancelled, a child's SystemExit: the attempt ends here too, and what it
        # changed and its last progress are written before the caller records its outcome. Also
        # when the stop landed in the success path's _end, cutting its save short: _end again
        # writes only what is not written yet
        # (tests/test_reports.py::test_a_stopped_attempt_keeps_its_metadata_and_last_progress).
        if job.context is not None:
            try:
                job.context._end(failed=True)
            except Exception as unsaved:
                logger.warning("job %s: its metadata was not saved: %s", job.id, unsaved)
        raise
    finally:
        running.reset(token)
        if job.context is not None:
            job.context = None  # no cycle (the context holds the claim) left for the collector
        _close_old_connections()
    return SUCCEEDED


def _close_old_connections() -> None:
    """Django's hygiene after a request, after each job: close connections that are broken or past
    CONN_MAX_AGE. (After, not also before: the thread that runs the next job ran this after the
    last one.) Skipped in a thread that never connected, and inside a transaction (``tick()``
    called in an ``atomic()`` block or a TestCase), where closing would break the caller's work."""
    if not thread_connected():
        return
    if not any(conn.in_atomic_block for conn in connections.all(initialized_only=True)):
        close_old_connections()


class Cancelled(str):
    """An executor's outcome for a run that it stopped, or did not start, because a cancel was
    requested: the text that last_error records. ``record`` ends a job cancelled for this type of
    outcome, or for any failure once the row carries a request, never for an error's text: a
    handler's own exception that reads ``JobCancelled: ...`` is a failure like any other
    (tests/test_cancel.py::test_an_error_named_job_cancelled_without_a_request_is_an_ordinary_failure)."""

    __slots__ = ()
    #: Whether the handler ran (and was stopped): False for CancelledUnrun.
    ran = True


class CancelledUnrun(Cancelled):
    """The outcome of a job whose handler never started: it carried a cancel request when it was
    claimed (asked_to_cancel)."""

    __slots__ = ()
    ran = False


def record(store: Store, job: Claimed, error: Any, tb: str | None, expired_before: int | None = None) -> str:
    """Write the outcome, fenced on the claim; return what happened ('done', 'retry', 'dead',
    'cancelled', 'lost').

    A row runner's row (a django.tasks row) is recorded by its runner, a failure and recovery's
    error text included (tests/test_tasks_worker.py)."""
    if isinstance(error, Cancelled):
        if record_cancel(store, job, error, tb, expired_before):
            return "cancelled"
        error = str(error)  # the row carries no request (or the claim is gone): what it is, a failure
    if error is not None:
        rows = registry.row_runner(job.job_type)
        if rows is not None:
            return rows.record(store, job, error, expired_before)  # a cancel included (outcomes.py)
    if error is None:
        applied, outcome = store.complete(job), "done"
    else:
        error = storable(error, ERROR_MAX)
        tb = None if tb is None else storable(tb, TRACEBACK_MAX, keep_end=True)
        applied, outcome = _record_failure(store, job, error, tb, clock.now(store.conn.alias), expired_before)
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
    elif expired_before is not None:
        how = "when its lease expired (its worker was lost)"
    else:
        how = "while it ran"
    if error is None:
        error = cancel_message(None, running=True)
    if not store.cancel_running(job, error, tb, now, expired_before):
        return False
    logger.warning("job %s (%s) cancelled %s", job.id, job.job_type, how)
    cancelled = job.as_job(status="cancelled", cancelled_at=now, last_error=error, traceback=tb)
    if is_registered(store.conn):  # tick() inside the caller's transaction: after it commits
        transaction.on_commit(lambda: send_cancelled(cancelled), using=store.conn.alias)
    else:
        send_cancelled(cancelled)
    return True


def _record_failure(
    store: Store, job: Claimed, error: str, tb: str | None, now: float, expired_before: int | None
) -> tuple[bool, str]:
    """Retry the failed job after its backoff, or move it to the dead-letter list once its retries
    are spent (sending job_dead): (applied, 'retry' or 'dead')."""
    attempts = job.attempts + 1
    if attempts <= job.max_retries:
        due = retry_at(attempts, now)
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


def run_claimed(store: Store, job: Claimed) -> str:
    """Run a job ``tick()`` claimed and record its outcome. A BaseException that is not an
    Exception (SystemExit, KeyboardInterrupt) is recorded as the job's failure, as the worker
    records it, then raised (tests/test_faults.py::test_tick_records_a_system_exit_then_raises)."""
    if asked_to_cancel(job):
        result = record_or_fallback(
            lambda fn: fn(store), job, CancelledUnrun(cancel_message(None, running=False)), None
        )
        settle(store, [(job, result)], int(clock.now(store.conn.alias)))
        return result
    try:
        error, tb = execute(job)
    except BaseException as exc:
        result = record_or_fallback(lambda fn: fn(store), job, describe(exc), traceback.format_exc())
        settle(store, [(job, result)], int(clock.now(store.conn.alias)))
        raise
    result = record_or_fallback(lambda fn: fn(store), job, error, tb)
    settle(store, [(job, result)], int(clock.now(store.conn.alias)))
    return result


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
