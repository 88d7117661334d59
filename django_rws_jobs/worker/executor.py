"""An executor: runs the jobs the dispatcher hands out, one at a time, in its own thread."""

from __future__ import annotations

import threading
import traceback

from django.db import connections

from ..conf import jobs_settings
from ..runner import describe, execute
from ..store import Claimed
from .shared import Shared
from .timeouts import Watchdog, timeout_for


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

    def loop(self) -> None:
        try:
            while self.run_once():
                pass
        finally:
            connections.close_all()

    def execute(self, job: Claimed) -> tuple[bool, str | None, str | None]:
        """Run ``job``: (abandoned, error, traceback)."""
        seconds = timeout_for(job, self.default_timeout)
        if seconds is None or self.watchdog is None:
            return (False, *execute(job))
        return self.watchdog.run(job, seconds)

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
        try:
            abandoned, error, tb = self.execute(job)
        except BaseException as exc:  # noqa: BLE001  (raised again below)
            self._outcome(ident, job, describe(exc), traceback.format_exc())
            raise
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
        if with_claim:
            shared.wake.set()  # an idle dispatcher deletes it now, not after its poll interval
