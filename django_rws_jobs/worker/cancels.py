"""The cancel watcher: stops the handlers of held jobs whose cancel was requested.

Every CHECK_INTERVAL it asks, by primary key, which of the jobs this worker has held for at
least CHECK_INTERVAL carry ``cancel_requested_at`` (jobs that end sooner are not asked about: a
request rarely beats them, and one that does finds the job done or ends it when it is recorded).
Each one found is stopped by the executor running it: the thread pool raises JobCancelled in the
handler's thread (unless the handler has returned: it stays done), the process pool terminates
the child (SIGTERM, SIGKILL after TIMEOUT_GRACE).
So a running job stops within about two intervals of the request
(tests/test_cancel.py::test_cancelling_a_running_job_stops_its_handler).
"""

from __future__ import annotations

import logging
import threading
import time

from django.db import Error as DatabaseError

from ..queue.store import Claimed
from .executor import STOPPING
from .reconnect import Retry
from .shared import Shared

logger = logging.getLogger("django_rws_jobs")

#: Seconds between two looks, and how long a job must have been held to be looked at.
CHECK_INTERVAL = 0.5


def requested(store: object, ids: list[str]) -> set[tuple[str, str]]:
    """(id, claim token) of the running jobs among ``ids`` whose cancel was requested."""
    marks = ", ".join(["%s"] * len(ids))
    with store.cursor() as c:  # type: ignore[attr-defined]
        c.execute(
            f"SELECT id, locked_by FROM rws_jobs WHERE id IN ({marks}) AND status = 'running' "
            "AND cancel_requested_at IS NOT NULL",
            ids,
        )
        return {(row[0], row[1]) for row in c.fetchall()}


class CancelWatcher:
    ROLE = "rws-cancels"

    def __init__(self, shared: Shared):
        self.shared = shared
        self.done = threading.Event()  # set at shutdown, once the last outcomes are recorded
        self.holder = shared.bookkeeping
        self.db = Retry(self.holder, shared.stop)
        self.first_seen: dict[tuple[str, str], float] = {}  # (token, id) -> time.monotonic()
        self.stopped: set[tuple[str, str]] = set()

    def loop(self) -> None:
        try:
            while not self.done.wait(CHECK_INTERVAL):
                self.shared.progress.turn(self.ROLE)  # a pass a CHECK_INTERVAL (the heartbeat file)
                try:
                    self.run_once(time.monotonic())
                except DatabaseError:
                    pass  # logged by Retry; the next look tries again
        finally:
            self.holder.close()

    def run_once(self, now: float) -> None:
        with self.shared.held_lock:
            held = list(self.shared.held.values())
        keys = {(job.token, job.id) for job in held}
        self.first_seen = {k: self.first_seen.get(k, now) for k in keys}
        self.stopped &= keys
        old = [j for j in held if now - self.first_seen[(j.token, j.id)] >= CHECK_INTERVAL]
        old = [j for j in old if (j.token, j.id) not in self.stopped]
        if not old:
            return
        ids = sorted({j.id for j in old})
        found = self.db.once(lambda c: requested(c.store(), ids), "looking for cancelled jobs")
        for job in old:
            if (job.id, job.token) in found:
                self._stop(job)

    def _stop(self, job: Claimed) -> None:
        for executor in list(self.shared.executors.values()):
            done = executor.cancel(job)
            if done is not None:
                self.stopped.add((job.token, job.id))
                level = logging.WARNING if done == STOPPING else logging.INFO
                logger.log(level, "job %s (%s): cancel requested; %s", job.id, job.job_type, done)
                return
