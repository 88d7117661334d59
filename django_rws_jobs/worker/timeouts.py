"""Job time limits: which limit a job has, and the thread pool's watchdog that enforces it.

The watchdog raises JobTimeout in a handler's thread at its deadline, with
``PyThreadState_SetAsyncExc`` (as Dramatiq's TimeLimit middleware does); Python delivers it between
two bytecodes, so a blocking C call is not interrupted. A thread still running ``TIMEOUT_GRACE``
seconds later is abandoned: the failure is recorded without it and a new thread takes its place
(tests/test_timeouts.py). docs/design.md says why and what a thread pool cannot stop.
"""

from __future__ import annotations

import ctypes
import logging
import queue
import threading
import time
import traceback
from dataclasses import dataclass

from ..attempts.outcomes import TRACEBACK_MAX, storable
from ..attempts.run import Watch as Handlers
from ..attempts.run import execute
from ..exceptions import JobTimeout, timeout_message
from ..queue.registry import time_limit
from ..queue.store import Claimed
from .shared import Shared

logger = logging.getLogger("django_rws_jobs")


def timeout_for(job: Claimed, default: float | None) -> float | None:
    """The job's time limit in seconds: its own, else its type's, else ``default``
    (registry.time_limit)."""
    return time_limit(job.timeout, job.job_type, default)[0]


def async_raise(ident: int, exc: type[BaseException] | None) -> None:
    """Raise ``exc`` in thread ``ident`` at its next bytecode; None drops one not yet raised."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(exc) if exc else None)


@dataclass(eq=False)
class Watch:
    """One running job with a time limit, and what the watchdog did about it."""

    job: Claimed
    ident: int  # the executor thread's
    seconds: float
    deadline: float  # time.monotonic()
    handlers: Handlers | None = None  # the executor's Watch: how to stop an async def handler
    fired: bool = False  # JobTimeout was raised in the thread (or its coroutine was stopped)
    finished: bool = False  # the executor is done with the job
    abandoned: bool = False  # the watchdog recorded the failure and gave the thread up


class Watchdog:
    """Raise JobTimeout in executor threads whose job ran past its limit; abandon the ones that
    do not stop within ``grace`` seconds."""

    ROLE = "rws-timeouts"

    def __init__(self, shared: Shared, grace: float):
        self.shared = shared
        self.grace = grace
        # A plain Lock, entered by C code only: a JobTimeout raised in a thread that enters a
        # Python-level lock (a Condition) can leave it held for ever.
        self.lock = threading.Lock()
        # A new watch, or close(): a SimpleQueue, whose put is one C call (an Event's set enters
        # a Condition, Python code a JobTimeout could stop half-way).
        self.wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        self.watches: set[Watch] = set()
        self.closed = False

    def run(
        self, job: Claimed, seconds: float, handlers: Handlers | None = None
    ) -> tuple[bool, str | None, str | None]:
        """Run ``job`` in the calling thread under its limit: (abandoned, error, traceback).
        Abandoned, the failure is recorded already: the caller drops its outcome. ``handlers``
        is the thread's run.Watch, through which an async def handler is stopped."""
        watch = Watch(job, threading.get_ident(), seconds, time.monotonic() + seconds, handlers)
        # From the moment the watch is in ``watches``, a JobTimeout may arrive at any bytecode of
        # this frame: everything after the add is inside the try whose handler records it
        # (tests/test_timeouts.py::test_limits_shorter_than_the_watchdogs_own_steps_keep_the_books).
        try:
            try:
                with self.lock:
                    self.watches.add(watch)
                self.wake.put(None)
                error, tb = execute(job)
            finally:
                self._finish(watch)
        except JobTimeout:  # raised in the handler, or in this frame before _finish ran
            self._finish(watch)
            logger.error(
                "job %s (%s) ran longer than its %g s limit: interrupted", job.id, job.job_type, seconds
            )
            return watch.abandoned, timeout_message(seconds), storable(traceback.format_exc(), TRACEBACK_MAX)
        except BaseException:
            self._finish(watch)
            if watch.abandoned:  # its failure is recorded and its slot freed: nothing more to say
                return True, None, None
            raise
        if watch.fired:  # it returned past its deadline (or swallowed JobTimeout): a failure all the same
            return watch.abandoned, timeout_message(seconds), tb
        return False, error, tb

    def _finish(self, watch: Watch) -> None:
        with self.lock:
            if not watch.finished:
                watch.finished = True
                self.watches.discard(watch)
                if watch.fired and not watch.abandoned:
                    async_raise(watch.ident, None)  # not delivered yet: it must not hit the executor

    def close(self) -> None:
        self.closed = True
        self.wake.put(None)

    def loop(self) -> None:
        """Each look is a turn (shared.progress); the waits between them are waits by design,
        until the next deadline or watch."""
        progress = self.shared.progress
        while not self.closed:
            progress.turn(self.ROLE)
            with self.lock:
                wait = self.run_once(time.monotonic())
            with progress.waiting(self.ROLE):
                try:
                    self.wake.get(timeout=wait)
                    while True:
                        self.wake.get_nowait()
                except queue.Empty:
                    pass

    def run_once(self, now: float) -> float | None:
        """Interrupt and abandon what is due at ``now`` (the caller holds ``lock``); return the
        seconds until the next thing to do, None when nothing is watched (a new watch wakes it)."""
        if not self.watches:
            return None
        next_at = now + 3600.0
        for watch in list(self.watches):
            if not watch.fired:
                if now < watch.deadline:
                    next_at = min(next_at, watch.deadline)
                    continue
                watch.fired = True
                self._interrupt(watch)
                self.shared.stats.count("timed_out")
            if now < watch.deadline + self.grace:
                next_at = min(next_at, watch.deadline + self.grace)
            else:
                self._abandon(watch)
        return max(next_at - now, 0.001)

    def _interrupt(self, watch: Watch) -> None:
        """JobTimeout in the handler's thread; for an async def handler on its event loop,
        asyncio.CancelledError at its next await, then JobTimeout in the thread
        (run.AsyncRun), decided under the Watch's lock, which the handler's run is armed
        under (tests/test_timeouts.py::test_an_async_handler_past_its_limit_is_stopped_at_its_await)."""
        handlers = watch.handlers
        if handlers is None:
            async_raise(watch.ident, JobTimeout)
            return
        with handlers.lock:
            if handlers.aio is not None:
                handlers.aio.stop(JobTimeout(timeout_message(watch.seconds)))
            else:
                async_raise(watch.ident, JobTimeout)

    def _abandon(self, watch: Watch) -> None:
        """Record the failure of a job whose thread does not stop, and free its executor's slot."""
        watch.abandoned = True
        self.watches.discard(watch)
        job, shared = watch.job, self.shared  # (its JobTimeout stays pending: it stops if it ever can)
        logger.error(
            "job %s (%s) ran longer than its %g s limit and did not stop within %g s (a blocking C "
            "call?): its thread is abandoned and replaced; it keeps what it holds until the worker "
            "exits (rws_worker --pool processes can kill such a handler)",
            job.id,
            job.job_type,
            watch.seconds,
            self.grace,
        )
        shared.executing.pop(watch.ident, None)
        shared.stats.count("abandoned")
        shared.results.put((job, timeout_message(watch.seconds), None))
        with shared.cond:
            shared.abandoned.add(watch.ident)
            shared.free += 1
            shared.cond.notify_all()
