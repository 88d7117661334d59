"""The worker: N threads that claim and run jobs, a lease keeper, and a scheduler thread.

One supervisor (the thread that calls :meth:`Worker.run`) owns small roles that share one stop
``Event``: job threads claim one job at a time and run it; the keeper renews the leases of running
jobs and takes back expired ones; the scheduler enqueues due cron jobs. Signal handlers only set
flags; every wait is on an Event, so a stop is instant.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import socket
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from django.db import DatabaseError, connections

from .conf import jobs_settings
from .db import private_connection, queue_alias
from .runner import execute, record, recover
from .store import Claimed, Store

logger = logging.getLogger("django_rws_jobs")

WORKER_ID = f"{socket.gethostname()[:40]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
_claims = itertools.count(1)
_claims_lock = threading.Lock()


def worker_id() -> str:
    # Recomputed after fork: a forked child must not share its parent's claim tokens.
    global WORKER_ID
    pid = str(os.getpid())
    if WORKER_ID.split(":")[1] != pid:
        WORKER_ID = f"{socket.gethostname()[:40]}:{pid}:{uuid.uuid4().hex[:8]}"
    return WORKER_ID


def claim_token() -> str:
    """A token unique to one claim: it fences every write that finishes the claimed jobs."""
    with _claims_lock:
        n = next(_claims)
    return f"{worker_id()}#{n}"


class DatabaseRetry:
    """Run a database call, waiting and reconnecting while the database is unreachable."""

    def __init__(self, conn_holder: "ConnectionHolder", stop: threading.Event):
        self.holder = conn_holder
        self.stop = stop

    def __call__(self, fn: Callable[[Store], Any], *, until: float | None = None, what: str = "") -> Any:
        delay = 0.2
        while True:
            try:
                return fn(self.holder.store())
            except DatabaseError as exc:
                self.holder.reset()
                if until is not None and time.monotonic() >= until:
                    raise
                logger.warning("database error while %s: %s; retrying in %.1fs", what or "working", exc, delay)
                if self.stop.wait(delay) and until is None:
                    raise
                delay = min(delay * 2, 5.0)


class ConnectionHolder:
    """A thread's private connection for the queue's bookkeeping, reopened after errors."""

    def __init__(self, alias: str):
        self.alias = alias
        self._conn = None

    def store(self) -> Store:
        if self._conn is None:
            self._conn = private_connection(self.alias)
        return Store(self._conn)

    def reset(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # the connection is already broken; dropping it is all we need
                pass

    close = reset


@dataclass
class WorkerStats:
    done: int = 0
    retried: int = 0
    dead: int = 0
    lost: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, outcome: str) -> int:
        with self.lock:
            attr = {"done": "done", "retry": "retried", "dead": "dead", "lost": "lost"}[outcome]
            setattr(self, attr, getattr(self, attr) + 1)
            return self.done + self.retried + self.dead + self.lost


class Worker:
    def __init__(
        self,
        *,
        threads: int = 1,
        queues: Sequence[str] | None = None,
        burst: bool = False,
        max_jobs: int | None = None,
        poll_interval: float | None = None,
        schedules: bool | None = None,
        using: str | None = None,
    ):
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        self.threads = threads
        self.queues = list(queues) if queues else None
        self.burst = burst
        self.max_jobs = max_jobs
        self.poll_interval = float(jobs_settings.POLL_INTERVAL if poll_interval is None else poll_interval)
        self.run_schedules = (not burst) if schedules is None else schedules
        self.alias = queue_alias(using)
        self.stop_event = threading.Event()   # stop claiming
        self.idle_threads: set[int] = set()
        self.running: dict[str, Claimed] = {}  # token -> job, for the lease keeper and shutdown
        self.running_lock = threading.Lock()
        self.stats = WorkerStats()
        self._threads: dict[str, threading.Thread] = {}
        self._signals = 0
        self.exit_code = 0

    # -- roles ------------------------------------------------------------------------------------

    def _job_loop(self, index: int) -> None:
        holder = ConnectionHolder(self.alias)
        db = DatabaseRetry(holder, self.stop_event)
        lease = int(jobs_settings.LEASE_SECONDS)
        try:
            while not self.stop_event.is_set():
                now = int(time.time())
                token = claim_token()
                try:
                    claimed = db(lambda s: s.claim(token, now, now + lease, self.queues, 1), what="claiming")
                except DatabaseError:
                    break  # only when stopping
                if not claimed:
                    if self.burst:
                        self.idle_threads.add(index)
                        if len(self.idle_threads) >= self.threads:
                            self.stop_event.set()
                        self.stop_event.wait(0.05)
                        continue
                    self.stop_event.wait(self.poll_interval)
                    continue
                self.idle_threads.discard(index)
                for job in claimed:
                    self._run_one(job, db)
        finally:
            holder.close()
            connections.close_all()

    def _run_one(self, job: Claimed, db: DatabaseRetry) -> None:
        with self.running_lock:
            self.running[job.token] = job
        fatal: BaseException | None = None
        try:
            try:
                error, tb = execute(job)
            except BaseException as exc:
                # SystemExit and the like: record the failure, then let this thread die (the
                # supervisor replaces it).
                fatal, error, tb = exc, f"{type(exc).__name__}: {exc}", traceback.format_exc()
            # Keep trying to record the outcome while the lease may still be ours.
            deadline = time.monotonic() + float(jobs_settings.LEASE_SECONDS)
            outcome = db(lambda s: record(s, job, error, tb), until=deadline, what=f"recording job {job.id}")
            if fatal is not None:
                raise fatal
        finally:
            with self.running_lock:
                self.running.pop(job.token, None)
        total = self.stats.add(outcome)
        if self.max_jobs is not None and total >= self.max_jobs:
            self.stop_event.set()

    def _keeper_loop(self) -> None:
        """Renew the leases of running jobs; take back expired ones from lost workers."""
        holder = ConnectionHolder(self.alias)
        db = DatabaseRetry(holder, self.stop_event)
        lease = int(jobs_settings.LEASE_SECONDS)
        renew_every = max(lease / 3, 0.2)
        next_recovery = time.monotonic() + jobs_settings.recovery_interval
        try:
            while not self._keeper_stop.wait(renew_every):
                try:
                    with self.running_lock:
                        tokens = list(self.running)
                    if tokens:
                        db(lambda s: s.renew(tokens, int(time.time()) + lease), until=time.monotonic(),
                           what="renewing leases")
                    if time.monotonic() >= next_recovery and not self.stop_event.is_set():
                        db(lambda s: recover(s), until=time.monotonic(), what="recovering expired leases")
                        next_recovery = time.monotonic() + jobs_settings.recovery_interval
                except DatabaseError:
                    continue  # logged by DatabaseRetry; the next round tries again
                except Exception:
                    logger.exception("lease keeper error")
        finally:
            holder.close()
            connections.close_all()

    def _scheduler_loop(self) -> None:
        from .schedules import scheduler_loop

        scheduler_loop(self.stop_event, self.alias)

    # -- supervisor -------------------------------------------------------------------------------

    def _spawn(self, name: str, target: Callable[..., None], *args: Any) -> None:
        def guarded() -> None:
            try:
                target(*args)
            except BaseException:
                logger.exception("worker thread %s died", name)
                raise

        t = threading.Thread(target=guarded, name=name, daemon=True)
        self._threads[name] = t
        t.start()

    def install_signal_handlers(self) -> None:
        def handler(signum: int, frame: Any) -> None:
            self._signals += 1
            if self._signals > 1:
                # Leases of running jobs expire and another worker's recovery takes them.
                os.write(2, b"second signal: exiting now\n")
                os._exit(1)
            self.stop_event.set()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def run(self) -> int:
        """Run until stopped (or, with burst, until nothing is due). Returns the exit code."""
        self._keeper_stop = threading.Event()
        holder = ConnectionHolder(self.alias)
        try:
            taken = DatabaseRetry(holder, self.stop_event)(lambda s: recover(s), what="recovering at start")
            if taken:
                logger.warning("took back %d job(s) whose worker was lost", taken)
        finally:
            holder.close()
        for i in range(self.threads):
            self._spawn(f"rws-job-{i}", self._job_loop, i)
        self._spawn("rws-keeper", self._keeper_loop)
        if self.run_schedules:
            self._spawn("rws-scheduler", self._scheduler_loop)
        while not self.stop_event.wait(0.5):
            for name, t in list(self._threads.items()):
                if not t.is_alive() and name.startswith("rws-job-"):
                    logger.error("worker thread %s died; starting a new one", name)
                    self._spawn(name, self._job_loop, int(name.rsplit("-", 1)[1]))
                elif not t.is_alive() and name == "rws-scheduler":
                    self._spawn(name, self._scheduler_loop)
        return self._shutdown()

    def _shutdown(self) -> int:
        timeout = float(jobs_settings.SHUTDOWN_TIMEOUT)
        if self.running and not self.burst:
            logger.info("stopping: waiting up to %ss for %d running job(s)", timeout, len(self.running))
        deadline = time.monotonic() + timeout
        for name, t in self._threads.items():
            if name.startswith("rws-job-") or name == "rws-scheduler":
                t.join(max(deadline - time.monotonic(), 0))
        with self.running_lock:
            unfinished = list(self.running.values())
        if unfinished:
            holder = ConnectionHolder(self.alias)
            try:
                for job in unfinished:
                    try:
                        if holder.store().release(job):
                            logger.warning("job %s (%s) did not finish within %ss; handed back unrun",
                                           job.id, job.job_type, timeout)
                    except DatabaseError as exc:
                        logger.error("could not hand back job %s: %s; its lease will expire", job.id, exc)
                        holder.reset()
            finally:
                holder.close()
        self._keeper_stop.set()
        keeper = self._threads.get("rws-keeper")
        if keeper is not None:
            keeper.join(5)
        logger.info("worker stopped: %d done, %d retried, %d dead, %d results dropped",
                    self.stats.done, self.stats.retried, self.stats.dead, self.stats.lost)
        return self.exit_code
