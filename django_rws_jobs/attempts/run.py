"""Running one attempt of a claimed job: its handler called outside any transaction, with
``current_job()`` set and the middleware around it (``execute``), an ``async def`` handler on an
event loop of its own that a stop reaches (``AsyncRun``), and what the executor that runs it
learns as soon as the handler returns (``Watch``). ``run_claimed`` runs a job ``tick()`` claimed
and records its outcome (outcomes.py)."""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from asgiref.sync import async_to_sync
from django.db import close_old_connections, connections

from ..database import clock
from ..database.connections import thread_connected
from ..exceptions import JobInterrupted, cancel_message
from ..queue import middleware
from ..queue.registry import registry
from ..queue.store import Claimed, Store
from ..running.context import current_job, inline, running
from ..workflows.batch_outcomes import settle
from .decisions import decided
from .outcomes import (
    TRACEBACK_MAX,
    CancelledUnrun,
    Interrupted,
    asked_to_cancel,
    describe,
    record_or_fallback,
    storable,
)

logger = logging.getLogger("django_rws_jobs")


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
    is marked by a plain store right after a handler returns (a row runner's function marks it
    itself), before the attempt's context ends, in one place whatever ended the attempt
    (``end_context``)."""
    handlers = watching(job)
    spec = registry.get(job.job_type)
    rows = None if spec is not None else registry.row_runner(job.job_type)
    if spec is None and rows is None:
        return f"no handler registered for job_type '{job.job_type}'", None
    token = running.set(job)  # current_job() in the handler or the task's function
    outcome: tuple[Any, str | None] = SUCCEEDED
    failed = True  # until the handler returns: a stop (a BaseException) leaves it so
    try:
        if rows is not None:
            value = rows.run(job)
            outcome, failed = (value, None), rows.failed(value)
            if handlers is not None:
                handlers.outcome = outcome
        elif spec is not None:
            executors = middleware.chains()[1]
            if executors:
                middleware.around(
                    executors, current_job(), lambda: call_handler(spec.func, job.payload, spec.is_async, job)
                )
            else:
                call_handler(spec.func, job.payload, spec.is_async, job)
            failed = False
            if handlers is not None:
                handlers.outcome = SUCCEEDED
    except JobInterrupted as exc:  # iterate() at the worker's stop, or the handler's own: handed back
        outcome = Interrupted(describe(exc)), None
    except Exception as exc:
        outcome = decided(exc, spec, job)  # a plain failure, or what the handler or its type decided
    finally:
        running.reset(token)
        try:
            if job.context is not None:  # the handler asked for current_job(): save what it changed
                unsaved = end_context(job, failed, fails=rows is None)
                if unsaved is not None:
                    outcome = unsaved
                    if handlers is not None:
                        handlers.outcome = unsaved
        finally:
            close_stale_connections()
    return outcome  # a failure is logged where it is recorded (_record_failure)


def end_context(job: Claimed, failed: bool, fails: bool) -> tuple[str, str] | None:
    """End the attempt's context (``JobContext._end``): save the metadata its handler changed,
    and a ``failed`` attempt's last progress. Metadata that cannot be saved fails a handler's
    attempt that ``fails`` by it (returned here as the failure); otherwise it is logged."""
    context = job.context
    assert context is not None
    job.context = None  # no cycle (the context holds the claim) left for the collector
    try:
        context._end(failed=failed)
    except Exception as unsaved:
        if fails and not failed:
            tb = "".join(traceback.format_exception(unsaved))
            return describe(unsaved), storable(tb, TRACEBACK_MAX, keep_end=True)
        logger.warning("job %s: its metadata was not saved: %s", job.id, unsaved)
    return None


def close_stale_connections() -> None:
    """Django's hygiene after a request, after each job: close connections that are broken or past
    CONN_MAX_AGE. (After, not also before: the thread that runs the next job ran this after the
    last one.) Skipped in a thread that never connected, and inside a transaction (``tick()``
    called in an ``atomic()`` block or a TestCase), where closing would break the caller's work."""
    if not thread_connected():
        return
    if not any(conn.in_atomic_block for conn in connections.all(initialized_only=True)):
        close_old_connections()


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
