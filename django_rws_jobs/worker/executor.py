"""An executor: runs the jobs the dispatcher hands out, one at a time, in its own thread."""

from __future__ import annotations

import threading
import traceback

from django.db import connections

from ..runner import describe, execute
from .shared import Shared


class Executor:
    """Run jobs from ``shared.work`` until it gives None; hand each outcome on.

    A succeeded job goes to ``shared.finished`` for the dispatcher to delete with its next claim
    while ``delete_with_claim`` is on, else every outcome goes to the completer.
    """

    def __init__(self, shared: Shared):
        self.shared = shared

    def loop(self) -> None:
        try:
            while self.run_once():
                pass
        finally:
            connections.close_all()

    def run_once(self) -> bool:
        """Run one job; False when told to stop. A BaseException that is not an Exception
        (SystemExit and the like) is recorded as the job's failure, then raised, so this thread
        dies and the supervisor replaces it
        (tests/test_worker.py::test_a_thread_killed_by_system_exit_is_replaced)."""
        shared = self.shared
        job = shared.work.get()
        if job is None:
            return False
        name = threading.current_thread().name
        shared.executing[name] = job
        fatal: BaseException | None = None
        error: str | None = None
        tb: str | None = None
        try:
            error, tb = execute(job)
        except BaseException as exc:  # noqa: BLE001  (raised again below)
            fatal, error, tb = exc, describe(exc), traceback.format_exc()
        finally:
            shared.executing.pop(name, None)
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
        if fatal is not None:
            raise fatal
        return True
