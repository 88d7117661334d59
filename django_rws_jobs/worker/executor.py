"""An executor: runs the jobs the dispatcher hands out, one at a time, in its own thread."""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable

from django.db import connections

from ..attempts.outcomes import TRACEBACK_MAX, Cancelled, CancelledUnrun, asked_to_cancel, describe, storable
from ..attempts.run import Watch, close_stale_connections, execute, watch
from ..conf import jobs_settings
from ..exceptions import JobCancelled, cancel_message
from ..queue.store import Claimed
from ..running.checkpoints import stop_requested
from ..running.context import serving
from .shared import Shared
from .timeouts import Watchdog, async_raise, timeout_for

logger = logging.getLogger("django_rws_jobs")

#: What an executor's ``cancel`` did, for the cancel watcher's log.
STOPPING = "stopping its handler"
RETURNED_FIRST = "its handler had returned: it stays done"


class Executor:
    """Run jobs from ``shared.work`` until it gives None; hand each outcome on.

    A succeeded job goes to ``shared.finished`` for the dispatcher to delete with its next claim
    while ``delete_with_claim`` is on, else every outcome goes to the completer. A job with a time
    limit runs under the ``watchdog``; one whose thread the watchdog abandoned ends this thread
    (its outcome is recorded already, and a new thread has its slot).
    """

    def __init__(self, shared: Shared, watchdog: Watchdog | None = None):
        self.shared = shared
        self.watchdog = watchdog
        self.default_timeout = jobs_settings.TIMEOUT
        self.handlers = Watch()  # whether the running job's handler has returned (run.Watch)
        # The job whose handler a cancel may stop, and whether one was raised for it (see cancel).
        # The Watch's plain Lock (entered by C code only, as the watchdog's): an async def
        # handler's run is armed under it (run.run_async).
        self.cancel_lock = self.handlers.lock
        self.running: Claimed | None = None
        self.ident = 0
        self.cancel_raised = False
        if logger.isEnabledFor(logging.DEBUG):
            # At DEBUG (rws_worker -v 2) each success is logged with its duration. Decided once
            # here: otherwise ``execute`` is the class's own and a job's path is unchanged
            # (tests/test_worker.py::test_verbosity_2_logs_each_success_with_its_duration).
            self.execute = self._timed(self.execute)  # type: ignore[method-assign,assignment]

    @staticmethod
    def _timed(
        execute: Callable[[Claimed], tuple[bool, str | None, str | None]],
    ) -> Callable[[Claimed], tuple[bool, str | None, str | None]]:
        def timed(job: Claimed) -> tuple[bool, str | None, str | None]:
            started = time.monotonic()
            outcome = execute(job)
            if outcome[1] is None:
                logger.debug(
                    "job %s (%s) succeeded in %.3fs", job.id, job.job_type, time.monotonic() - started
                )
            return outcome

        return timed

    def loop(self) -> None:
        ident = threading.get_ident()
        watch(self.handlers)
        serving.set(self.shared.alias)  # current_job()'s database in this thread's handlers
        stop_requested.set(self.shared.interrupt)  # current_job().stopping in them
        self.shared.executors[ident] = self
        try:
            while self.run_once():
                pass
        finally:
            self.shared.executors.pop(ident, None)
            connections.close_all()

    def cancel(self, job: Claimed) -> str | None:
        """Stop ``job``'s handler if this executor runs it now: JobCancelled raised in its thread
        at its next bytecode (a blocking C call is not interrupted; see README), or, for an async
        def handler on its event loop, asyncio.CancelledError at its next await, then JobCancelled
        here (run.AsyncRun). Nothing once the handler has returned: it stays done. Returns
        what it did (STOPPING, RETURNED_FIRST), or None when this executor does not run ``job``."""
        with self.cancel_lock:
            if self.running is not job:
                return None
            if self.handlers.outcome is not None:
                return RETURNED_FIRST
            if not self.cancel_raised:
                self.cancel_raised = True
                if self.handlers.aio is not None:
                    self.handlers.aio.stop(JobCancelled(cancel_message(None, running=True)))
                else:
                    async_raise(self.ident, JobCancelled)
            return STOPPING

    def execute(self, job: Claimed) -> tuple[bool, str | None, str | None]:
        """Run ``job``: (abandoned, error, traceback). From the moment ``running`` is set, a
        JobCancelled may arrive at any bytecode of this frame: everything after it is inside the
        try whose handler records it, and _stop_cancels drops one raised but not delivered. One
        that lands after the handler returned (raised just before) leaves the handler's outcome
        as it was (run.Watch). A JobCancelled that this executor did not raise (the
        handler's own, with no cancel asked) is a failure like any other."""
        try:
            try:
                with self.cancel_lock:
                    self.running, self.ident, self.cancel_raised = job, threading.get_ident(), False
                    self.handlers.start(job)
                return self._run(job)
            finally:
                self._stop_cancels()
        except JobCancelled as exc:
            self._stop_cancels()
            if self.handlers.outcome is not None:
                close_stale_connections()  # the clean-up it cut short
                return (False, *self.handlers.result())
            tb = storable(traceback.format_exc(), TRACEBACK_MAX, keep_end=True)
            if self.cancel_raised:
                return False, Cancelled(cancel_message(None, running=True)), tb
            return False, describe(exc), tb

    def _stop_cancels(self) -> None:
        with self.cancel_lock:
            if self.running is not None:
                if self.cancel_raised:
                    async_raise(self.ident, None)  # not delivered yet: it must not hit the executor
                self.running = None

    def _run(self, job: Claimed) -> tuple[bool, str | None, str | None]:
        seconds = timeout_for(job, self.default_timeout)
        if seconds is None or self.watchdog is None:
            return (False, *execute(job))
        return self.watchdog.run(job, seconds, self.handlers)

    def run_once(self) -> bool:
        """Run one job; False when told to stop. A BaseException that is not an Exception
        (SystemExit and the like) is recorded as the job's failure, then raised, so this thread
        dies and the supervisor replaces it
        (tests/test_worker.py::test_a_thread_killed_by_system_exit_is_replaced)."""
        shared = self.shared
        job = shared.work.get()
        if job is None:
            return False
        ident = threading.get_ident()
        shared.executing[ident] = job
        t0 = time.monotonic()
        try:
            outcome: tuple[bool, str | None, str | None]
            if asked_to_cancel(job):  # a request the Rust crate put the job back past
                close_stale_connections()
                outcome = False, CancelledUnrun(cancel_message(None, running=False)), None
            else:
                outcome = self.execute(job)
            abandoned, error, tb = outcome
        except BaseException as exc:  # noqa: BLE001  (raised again below)
            self._outcome(ident, job, describe(exc), traceback.format_exc())
            raise
        shared.counters.ran(job, time.monotonic() - t0, t0)
        if abandoned:
            return False
        self._outcome(ident, job, error, tb)
        return True

    def _outcome(self, ident: int, job: Claimed, error: str | None, tb: str | None) -> None:
        shared = self.shared
        shared.executing.pop(ident, None)
        with shared.cond:
            with_claim = error is None and shared.delete_with_claim
            if with_claim:
                shared.finished.append(job)
            else:
                shared.results.put((job, error, tb))
            shared.free += 1
            shared.cond.notify_all()
        if with_claim and not shared.wake.is_set():
            # An idle dispatcher deletes it now, not after its poll interval; a hint already set
            # since the dispatcher took the last succeeded jobs does that too (Dispatcher.run_once).
            shared.wake.set()
