"""``rws_worker --pool processes``: each executor thread runs its jobs in a child process of its own.

The claim, the lease keeper, the completer and hand-back stay in the worker (the parent), as in
the thread pool; only the handler runs in the child (worker/child.py). The executor waits for the
child's answer up to the job's time limit; past it the child is killed (SIGTERM, then SIGKILL
after TIMEOUT_GRACE) and the job fails with JobTimeout. A child that dies mid-job is a failed
attempt recorded at once. A child is retired between two jobs after ``max_jobs`` jobs or once its
peak memory passes ``max_memory_mb``. Pinned by tests/test_pool.py.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Iterable

from ..attempts.outcomes import Cancelled
from ..conf import jobs_settings
from ..database.validation import INT32_MAX, INT64_MAX, integer
from ..exceptions import cancel_message, timeout_message
from ..queue.store import Claimed
from .child import Child, ChildDied
from .executor import STOPPING, Executor
from .shared import Shared
from .timeouts import timeout_for

logger = logging.getLogger("django_rws_jobs")


class Pool:
    """The worker's live children, and the limits that retire them."""

    def __init__(self, *, grace: float, max_jobs: int | None, max_memory_mb: int | None, alias: str):
        self.alias = alias  # the queue's database, as current_job() in a child reads it
        self.grace = grace
        self.max_jobs = max_jobs
        self.max_memory_mb = max_memory_mb
        self.children: set[Child] = set()
        self.ready: list[Child] = []  # started before the first claim, not yet an executor's
        self.lock = threading.Lock()
        # Set when the worker kills its children to hand their jobs back: what their executors
        # see then is not the jobs' outcome.
        self.stopping = False

    def prestart(self, n: int) -> None:
        """Start ``n`` children before the worker claims: the fork server's start (a Python and
        Django set-up, about a second) is not spent while claimed jobs wait."""
        for _ in range(n):
            self.ready.append(self._new())

    def start(self) -> Child:
        """A child ready to run jobs: one started beforehand, else a new one."""
        with self.lock:
            if self.ready:
                return self.ready.pop()
        return self._new()

    def _new(self) -> Child:
        child = Child(self.alias)
        with self.lock:
            self.children.add(child)
        return child

    def forget(self, child: Child) -> None:
        with self.lock:
            self.children.discard(child)

    def spent(self, child: Child) -> str | None:
        """Why ``child`` is to be retired after the job it just ran, or None."""
        if self.max_jobs is not None and child.jobs >= self.max_jobs:
            return f"it ran {child.jobs} jobs (--max-jobs-per-child)"
        if self.max_memory_mb is not None and child.peak_mb > self.max_memory_mb:
            return f"its peak memory is {child.peak_mb:.0f} MB (--max-memory-per-child {self.max_memory_mb})"
        return None

    def stop_running(self, threads: Iterable[threading.Thread]) -> None:
        """Kill the children (those of unfinished jobs are the ones left): SIGTERM, then SIGKILL
        after TIMEOUT_GRACE (at most 5 s) to the ones still there."""
        self.stopping = True
        self.kill_all(signal.SIGTERM)
        deadline = time.monotonic() + min(self.grace, 5.0)
        for t in threads:
            if t.name.startswith("rws-job-"):
                t.join(max(deadline - time.monotonic(), 0))
        self.kill_all(signal.SIGKILL)

    def kill_all(self, sig: int = signal.SIGKILL) -> None:
        """Signal every child; safe in a signal handler (no lock taken)."""
        for child in list(self.children):
            try:
                os.kill(child.pid, sig)
            except (ProcessLookupError, ValueError):
                pass


def failed(outcome: object) -> bool:
    """Whether a child's answer is a failure: an error text, or a row runner's outcome that
    carries an error (a task's outcome is an object also when the task succeeded)
    (tests/test_cancel.py::test_a_task_that_succeeds_after_its_cancels_sigterm_reads_successful)."""
    if outcome is None or isinstance(outcome, str):
        return outcome is not None
    return getattr(outcome, "error", None) is not None


def make_pool(kind: str, max_jobs: int | None, max_memory_mb: int | None, alias: str) -> Pool | None:
    """The process pool's settings (None for the thread pool), or ValueError naming what is wrong."""
    if kind not in ("threads", "processes"):
        raise ValueError(f"pool {kind!r} is not one of threads, processes")
    if kind == "threads":
        if max_jobs is not None or max_memory_mb is not None:
            raise ValueError("max_jobs_per_child and max_memory_per_child need pool='processes'")
        return None
    return Pool(
        grace=float(jobs_settings.TIMEOUT_GRACE),
        max_jobs=None if max_jobs is None else integer("max_jobs_per_child", max_jobs, 1, INT64_MAX),
        max_memory_mb=None
        if max_memory_mb is None
        else integer("max_memory_per_child", max_memory_mb, 1, INT32_MAX),
        alias=alias,
    )


class ProcessExecutor(Executor):
    """An executor whose jobs run in its child process; a new child replaces one that died, timed
    out or was retired."""

    def __init__(self, shared: Shared, pool: Pool):
        super().__init__(shared)
        self.pool = pool
        self.child: Child | None = None

    def loop(self) -> None:
        try:
            super().loop()
        finally:
            if self.child is not None:
                self._drop(self.child, stop=True)

    def _drop(self, child: Child, *, stop: bool = False, kill: bool = False) -> None:
        self.child = None
        if stop:
            child.stop()
        elif kill:
            child.kill(self.pool.grace)
        self.pool.forget(child)

    def _send(self, job: Claimed) -> Child:
        """Send ``job`` to this executor's child, started anew if it has none or it is gone."""
        child = self.child
        if child is not None:
            try:
                child.send(job)
                return child
            except OSError:  # it died while idle
                self._drop(child, kill=True)
        child = self.child = self.pool.start()
        child.send(job)
        return child

    def cancel(self, job: Claimed) -> str | None:
        """Stop ``job`` if this executor's child runs it: SIGTERM (SystemExit in the handler), then
        SIGKILL after TIMEOUT_GRACE; the job is recorded cancelled unless it succeeded first."""
        with self.cancel_lock:
            child = self.child
            if self.running is not job or child is None:
                return None
            self.cancel_raised = True
        # Not in this (the watcher's) thread: the grace may be seconds. Its executor sees the
        # child die (ChildDied) or answer its SystemExit.
        threading.Thread(
            target=child.kill, args=(self.pool.grace,), kwargs={"close": False}, daemon=True
        ).start()
        return STOPPING

    def execute(self, job: Claimed) -> tuple[bool, str | None, str | None]:
        started = time.monotonic()
        with self.cancel_lock:
            self.running, self.cancel_raised = job, False
        try:
            abandoned, error, tb = self._execute(job)
            with self.cancel_lock:
                cancelled, self.running = self.cancel_raised, None
            if cancelled and not abandoned:
                # The cancel's SIGTERM is on its way to this child, even if the job succeeded
                # first: a child reused for the next job would take it for that job's.
                if self.child is not None:
                    self._drop(self.child, kill=True)
                if failed(error):  # a success the child answered stays one
                    return False, Cancelled(cancel_message(None, running=True)), None
            return abandoned, error, tb
        finally:
            took = time.monotonic() - started
            recent = self.shared.recent_run
            self.shared.recent_run = took if recent is None else recent + (took - recent) / 8

    def _execute(self, job: Claimed) -> tuple[bool, str | None, str | None]:
        seconds = timeout_for(job, self.default_timeout)
        child = self._send(job)
        try:
            answer = child.answer(seconds)
        except ChildDied as exc:
            self._drop(child)
            if self.pool.stopping:
                return True, None, None  # killed to hand the job back: the worker does that
            self.shared.stats.count("children_lost")
            logger.error(
                "job %s (%s): its child process %d died while it ran: %s",
                job.id,
                job.job_type,
                child.pid,
                exc,
            )
            return False, f"worker child died: {exc}", None
        if answer is None:
            assert seconds is not None  # (no limit: answer() waits until there is an answer)
            logger.error(
                "job %s (%s) ran longer than its %g s limit: killing its child process %d",
                job.id,
                job.job_type,
                seconds,
                child.pid,
            )
            self.shared.stats.count("timed_out")
            self._drop(child, kill=True)
            return False, timeout_message(seconds), None
        if answer[3] and self.pool.stopping:  # its SIGTERM's SystemExit: the worker hands the job back
            self._drop(child)
            return True, None, None
        why = "its handler raised " + (answer[0] or "") if answer[3] else self.pool.spent(child)
        if why is not None:
            logger.info("retiring child process %d: %s", child.pid, why)
            self._drop(child, stop=True)
        return False, answer[0], answer[1]
