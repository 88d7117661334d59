"""The state a worker's roles share, in one small object each role receives."""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.db import Error as DatabaseError

from ..attempts.outcomes import record_cancel
from ..database import clock
from ..flow.concurrency_keys import keys_of, promote
from ..operations.metrics import Counters
from ..queue.store import Claimed
from ..running.checkpoints import StopFlag
from ..workflows.batch_outcomes import settle
from .reconnect import Connection

logger = logging.getLogger("django_rws_jobs")

#: Claim durations a worker keeps between two heartbeats, for their 99th percentile.
CLAIMS_KEPT = 10_000

#: An executor's outcome: the job, its error (None when it succeeded) and traceback.
Outcome = tuple[Claimed, "str | None", "str | None"]


@dataclass
class Stats:
    done: int = 0
    retried: int = 0
    snoozed: int = 0  # attempts its handler ended with Snooze (no attempt charged)
    interrupted: int = 0  # jobs handed back at the stop by iterate or JobInterrupted
    dead: int = 0
    lost: int = 0
    timed_out: int = 0
    abandoned: int = 0  # executor threads given up on (see worker/timeouts.py)
    children_lost: int = 0  # child processes that died mid-job (see worker/pool.py)
    cancelled: int = 0  # jobs cancelled while this worker held them (cancellation.py)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # The durations of the claims since the last heartbeat took them (claim_p99), the last
    # CLAIMS_KEPT of them.
    claims: deque[float] = field(default_factory=lambda: deque(maxlen=CLAIMS_KEPT))

    def claimed(self, seconds: float) -> None:
        """A claim's round trip took ``seconds`` (deque.append: safe without the lock)."""
        self.claims.append(seconds)

    def claim_p99(self) -> float | None:
        """The 99th percentile of the claims' durations since the last call; None without any."""
        taken = [self.claims.popleft() for _ in range(len(self.claims))]
        if not taken:
            return None
        taken.sort()
        return taken[min(int(len(taken) * 0.99), len(taken) - 1)]

    def count(self, name: str) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + 1)

    def add(self, outcomes: Iterable[str]) -> None:
        with self.lock:
            for outcome in outcomes:
                attr = {
                    "done": "done",
                    "retry": "retried",
                    "snoozed": "snoozed",
                    "interrupted": "interrupted",
                    "dead": "dead",
                    "lost": "lost",
                    "cancelled": "cancelled",
                }[outcome]
                setattr(self, attr, getattr(self, attr) + 1)


def fix_hint(exc: BaseException) -> str:
    """What to do about a permanent error, where its message says."""
    text = str(exc).lower()
    if any(
        m in text
        for m in (
            "no such table",
            "does not exist",
            "doesn't exist",
            "no such column",
            "unknown column",
            "has no column",
        )
    ):
        return " (have the migrations run? python manage.py migrate django_rws_jobs)"
    if any(m in text for m in ("denied", "permission", "not authorized", "readonly", "read-only")):
        return " (the database user needs to read and write rws_jobs and rws_job_schedules)"
    return ""


class Progress:
    """When each watched role of a worker last began a turn of its loop (``time.monotonic()``).

    The supervisor touches the heartbeat file only while every watched role began a turn within
    its bound, so a role stuck (on a database lock, a Python lock) lets the file go stale while
    the process lives (tests/test_health.py
    test_the_heartbeat_file_goes_stale_while_a_role_is_stuck). A role that waits by design for
    as long as it takes (an idle poll, executors all busy, the scheduler without schedules, the
    watchdog until its next deadline) marks that wait with ``waiting``: it makes progress until
    the wait ends. Each mark is one dict assignment, atomic under the GIL: no lock.
    """

    def __init__(self) -> None:
        self.turns: dict[str, float] = {}

    def turn(self, role: str) -> None:
        self.turns[role] = time.monotonic()

    @contextmanager
    def waiting(self, role: str) -> Iterator[None]:
        """A wait by design: progress whatever its length; a turn when it ends."""
        self.turns[role] = math.inf
        try:
            yield
        finally:
            self.turns[role] = time.monotonic()

    def stalled(self, bound: float) -> list[tuple[str, float]]:
        """(role, seconds since its last turn began) of the roles past ``bound``, by name."""
        now = time.monotonic()
        return sorted((role, now - at) for role, at in list(self.turns.items()) if now - at > bound)


class Shared:
    """What the roles of one worker share.

    ``free`` counts idle executors; the dispatcher claims at most that many jobs, so a worker never
    holds a job it cannot start now
    (tests/test_worker.py::test_a_worker_holds_no_more_jobs_than_it_has_threads).
    ``held`` maps (claim token, job id) to every job claimed and not yet recorded: the keeper
    renews their leases. ``finished`` holds succeeded jobs the dispatcher deletes with its next
    claim while ``delete_with_claim`` is on (features.deletes_with_claim); ``cond`` guards
    ``free``, ``finished`` and ``delete_with_claim``.
    """

    def __init__(self, alias: str, threads: int):
        self.alias = alias
        self.threads = threads
        self.stop = threading.Event()  # stop claiming
        # Running jobs are asked to stop (current_job().stopping; iterate hands its job back):
        # set by Worker.stop (a signal, the parent gone), not by a worker that stops by itself.
        self.interrupt = StopFlag()
        self.wake = threading.Event()  # a hint that jobs may be due: look now
        self.cond = threading.Condition()
        self.free = threads
        self.finished: list[Claimed] = []
        self.delete_with_claim = False
        self.work: queue.SimpleQueue[Claimed | None] = queue.SimpleQueue()
        self.results: queue.SimpleQueue[Outcome | None] = queue.SimpleQueue()
        self.held: dict[tuple[str, str], Claimed] = {}
        self.held_lock = threading.Lock()
        self.executing: dict[int, Claimed] = {}  # executor thread ident -> job it runs
        self.executors: dict[int, Any] = {}  # executor thread ident -> its Executor (cancels.py)
        # Executor threads the watchdog gave up on (guarded by ``cond``): the supervisor starts
        # new ones in their place.
        self.abandoned: set[int] = set()
        self.stats = Stats()
        # One connection for the roles that each run a few statements a second or less: the
        # lease keeper, the cancel watcher and the scheduler take turns on it (reconnect.Connection).
        self.bookkeeping = Connection(alias, shared=True)
        self.counters = Counters()  # per minute, queue and job type: written by the completer
        self.progress = Progress()  # the watched roles' turns: the heartbeat file's (supervisor.py)
        self.exit_code = 0
        # Seconds a job takes from hand-out to outcome, a moving average kept by the process
        # pool's executors (None: not measured): the dispatcher's gather window (dispatcher.py).
        self.recent_run: float | None = None
        # Set by due_now: the dispatcher's next look sweeps the concurrency keys.
        self.keys_hint = False

    def due_now(self) -> None:
        """Jobs became due by this process's doing (a release, a promotion, a callback): the
        dispatcher claims now, whether it waits idle or in a burst's wait for running jobs, and
        sweeps the concurrency keys first (a released keyed job waits for its key's promotion).
        ``keys_hint`` outlives the wake-up's Event, which a dispatcher clears as its look begins:
        a hint that came just before the clear is still acted on
        (tests/test_batch_workers.py::test_a_chain_of_keyed_jobs_runs_without_polling)."""
        self.keys_hint = True
        self.wake.set()
        with self.cond:
            self.cond.notify_all()

    def stop_all(self) -> None:
        self.stop.set()
        self.wake.set()

    def fail(self, exc: BaseException, what: str) -> None:
        """Stop with exit code 1 after an error that retrying cannot fix (a missing table, a
        permission): waiting would only hide it
        (tests/test_faults.py::test_a_worker_without_its_tables_fails_fast)."""
        logger.critical(
            "stopping: the database refused %s with an error that retrying cannot fix: %s%s",
            what,
            exc,
            fix_hint(exc),
        )
        self.exit_code = 1
        self.stop_all()

    def hold(self, jobs: list[Claimed]) -> None:
        with self.held_lock:
            for job in jobs:
                self.held[(job.token, job.id)] = job

    def let_go(self, jobs: list[Claimed]) -> None:
        """Stop holding ``jobs``: the keeper no longer renews their leases."""
        with self.held_lock:
            for job in jobs:
                self.held.pop((job.token, job.id), None)

    def to_completer(self, jobs: list[Claimed]) -> None:
        for job in jobs:
            self.results.put((job, None, None))

    def hand_back(self, jobs: list[Claimed], why: str) -> None:
        """Release claimed jobs without charging an attempt (fenced on their claim); one whose
        handler runs counts a resumption."""
        holder = Connection(self.alias)
        with self.held_lock:
            started = {id(job) for job in self.executing.values()}
        try:
            released = []
            cancelled = []
            for job in jobs:
                try:
                    if holder.store().release(job, resumed=id(job) in started):
                        released.append(job)
                        logger.warning("job %s (%s) handed back: %s", job.id, job.job_type, why)
                    elif record_cancel(holder.store(), job, None, None):  # its cancel was requested
                        released.append(job)
                        cancelled.append((job, "cancelled"))
                except DatabaseError as exc:
                    logger.error("could not hand back job %s: %s; its lease will expire", job.id, exc)
                    holder.reset()
            if cancelled:
                try:
                    settle(holder.store(), cancelled, int(clock.now(self.alias)))
                except DatabaseError as exc:
                    logger.error("could not record %d cancelled batch member(s): %s", len(cancelled), exc)
            keys = keys_of(released)
            if keys:
                try:  # the next job of each key, for another worker (the sweeps would, later)
                    promote(holder.store(), keys, int(clock.now(self.alias)))
                except DatabaseError as exc:
                    logger.error("could not promote the jobs of %d concurrency key(s): %s", len(keys), exc)
        finally:
            holder.close()
            self.let_go(jobs)


def outcomes(succeeded: list[Claimed], done: set[str]) -> list[str]:
    """ "done" for each succeeded job whose deletion ``done`` confirms, else "lost" (logged)."""
    result = []
    for job in succeeded:
        if job.id in done:
            result.append("done")
        else:
            result.append("lost")
            logger.warning(
                "job %s (%s): result 'done' dropped: claim %s no longer holds it "
                "(its lease expired and another worker took it over)",
                job.id,
                job.job_type,
                job.token,
            )
    return result
