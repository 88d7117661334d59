"""The worker: executor threads fed by one dispatcher, a completer, a lease keeper, a scheduler.

One supervisor (the thread that calls :meth:`Worker.run`) owns small roles that share one stop
``Event``: the dispatcher claims as many due jobs as there are idle executors; executors run them;
the completer records outcomes in batches; the keeper renews the leases of held jobs and takes back
expired ones; the scheduler enqueues due cron jobs; on PostgreSQL a listener turns NOTIFY into a
wake-up (polling still runs, so a pooler that breaks LISTEN costs latency, not jobs). Signal handlers only set
flags; every wait is on an Event, so a stop is instant.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import signal
import socket
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from django.db import close_old_connections, connections
from django.db import Error as DjangoDbError

from .checks import check_value, require_valid_settings
from .conf import jobs_settings
from .db import is_transient, private_connection, queue_alias
from .runner import describe, execute, record_or_fallback, recover
from .store import Claimed, Store
from .validation import INT32_MAX, INT64_MAX, integer, queue_list

logger = logging.getLogger("django_rws_jobs")

#: How often an idle worker on SQLite checks whether another connection wrote (seconds).
SQLITE_WATCH_INTERVAL = 0.002
#: A role thread that dies again within this many seconds of its start is restarted later each
#: time: 1 s, 2 s, 4 s ... up to RESPAWN_DELAY_MAX.
RESPAWN_QUICK = 10.0
RESPAWN_DELAY_MAX = 30.0

def _new_worker_id() -> None:
    global WORKER_ID
    WORKER_ID = f"{socket.gethostname()[:40]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


WORKER_ID = ""
_new_worker_id()
# A forked child must not share its parent's claim tokens. (Set at fork, not checked at each
# claim: the check was a twentieth of a SQLite dispatcher's time.)
os.register_at_fork(after_in_child=_new_worker_id)
_claims = itertools.count(1)
_claims_lock = threading.Lock()


def worker_id() -> str:
    return WORKER_ID


def claim_token() -> str:
    """A token unique to one claim: it fences every write that finishes the claimed jobs."""
    with _claims_lock:
        n = next(_claims)
    return f"{worker_id()}#{n}"


class DatabaseRetry:
    """Run a database call, waiting and reconnecting while the database is unreachable.

    Without ``until`` it retries until it succeeds or the worker stops (then it raises); with
    ``until`` (a time.monotonic() deadline) it retries until then, stopping or not, because an
    outcome must be written if at all possible. An error that retrying cannot fix (see
    db.is_transient) is raised at once.
    """

    def __init__(self, conn_holder: "ConnectionHolder", stop: threading.Event):
        self.holder = conn_holder
        self.stop = stop
        self._pause = threading.Event()  # never set: a plain wait that a stop does not cut short

    def __call__(self, fn: Callable[[Store], Any], *, until: float | None = None, what: str = "") -> Any:
        delay = 0.2
        while True:
            try:
                return fn(self.holder.store())
            except DjangoDbError as exc:
                self.holder.reset()
                if not is_transient(exc):
                    raise
                give_up = (until is not None and time.monotonic() + delay >= until) or (
                    until is None and self.stop.is_set())
                if give_up:
                    logger.warning("database error while %s: %s; giving up", what or "working", exc)
                    raise
                logger.warning("database error while %s: %s; retrying in %.1fs", what or "working", exc, delay)
                if until is None:
                    if self.stop.wait(delay):
                        raise
                else:
                    self._pause.wait(delay)
                delay = min(delay * 2, 5.0)


def fix_hint(exc: BaseException) -> str:
    """What to do about a permanent error, where its message says."""
    text = str(exc).lower()
    if any(m in text for m in ("no such table", "does not exist", "doesn't exist", "no such column",
                               "unknown column", "has no column")):
        return " (have the migrations run? python manage.py migrate django_rws_jobs)"
    if any(m in text for m in ("denied", "permission", "not authorized", "readonly", "read-only")):
        return " (the database user needs to read and write rws_jobs and rws_job_schedules)"
    return ""


class ConnectionHolder:
    """A thread's private connection for the queue's bookkeeping, reopened after errors."""

    def __init__(self, alias: str):
        self.alias = alias
        self._conn = None
        self._store: Store | None = None

    def store(self) -> Store:
        # One Store per connection: it is asked for on every claim and completion.
        if self._store is None:
            self._conn = private_connection(self.alias)
            self._store = Store(self._conn)
        return self._store

    def reset(self) -> None:
        conn, self._conn, self._store = self._conn, None, None
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
    """One worker process: a dispatcher, N executor threads, a completer, a lease keeper, a scheduler.

    The dispatcher claims at most as many jobs as there are idle executors, in one statement, so
    a worker never holds a job it cannot start now; executors run handlers; the completer records
    outcomes, deleting finished jobs in batches (whatever finished while it wrote the last batch).
    """

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
        # Bad arguments and settings raise here, before any thread starts
        # (tests/test_input.py::test_worker_refuses_bad_arguments_and_settings).
        require_valid_settings()
        self.threads = integer("threads", threads, 1, INT32_MAX)
        self.queues = queue_list(queues)
        self.burst = burst
        self.max_jobs = None if max_jobs is None else integer("max_jobs", max_jobs, 1, INT64_MAX)
        if poll_interval is not None:
            check_value("POLL_INTERVAL", poll_interval, "poll_interval")
        self.poll_interval = float(jobs_settings.POLL_INTERVAL if poll_interval is None else poll_interval)
        self.run_schedules = (not burst) if schedules is None else schedules
        self.alias = queue_alias(using)
        self.vendor = connections[self.alias].vendor
        self.stop_event = threading.Event()  # stop claiming
        self.wake = threading.Event()  # a hint that jobs may be due: look now
        self.cond = threading.Condition()  # guards self.free
        self.free = threads  # idle executors
        # SQLite: jobs that succeeded, for the dispatcher to delete in its next claim's
        # transaction while it runs (otherwise they go to the completer like every other
        # outcome). One writer at a time is all SQLite allows, and a commit and a turn at the
        # write lock fewer per batch drained faster. PostgreSQL and MariaDB drain faster with the
        # deletes beside the claims, on the completer's connection (measured: riding on the
        # claim's statement, they lengthened every claim by more than they saved). Guarded by
        # self.cond.
        self.finished: list[Claimed] = []
        self.riding = False
        self.claimed_total = 0
        self.work: queue.SimpleQueue[Claimed | None] = queue.SimpleQueue()
        self.results: queue.SimpleQueue[tuple[Claimed, str | None, str | None] | None] = queue.SimpleQueue()
        self.held: dict[tuple[str, str], Claimed] = {}  # claimed and not yet recorded
        self.executing: dict[str, Claimed] = {}  # executor thread name -> job it runs
        self.held_lock = threading.Lock()
        self.stats = WorkerStats()
        self._threads: dict[str, threading.Thread] = {}
        self._started: dict[str, float] = {}  # role -> time.monotonic() of its thread's start
        self._signals = 0
        self.exit_code = 0

    def stop(self) -> None:
        self.stop_event.set()
        self.wake.set()

    def fail(self, exc: BaseException, what: str) -> None:
        """Stop with exit code 1 after an error that retrying cannot fix (a missing table, a
        permission): waiting would only hide it. Pinned by
        tests/test_faults.py::test_a_worker_without_its_tables_fails_fast."""
        logger.critical("stopping: the database refused %s with an error that retrying cannot fix: %s%s",
                        what, exc, fix_hint(exc))
        self.exit_code = 1
        self.stop()

    # -- roles ------------------------------------------------------------------------------------

    def _dispatch_loop(self) -> None:
        holder = ConnectionHolder(self.alias)
        db = DatabaseRetry(holder, self.stop_event)
        lease = int(jobs_settings.LEASE_SECONDS)
        idle = False
        with self.cond:
            self.riding = self.vendor == "sqlite"
        try:
            while not self.stop_event.is_set():
                with self.cond:
                    while self.free == 0 and not self.stop_event.is_set():
                        self.cond.wait(0.5)
                    n = self.free
                    if self.max_jobs is not None:
                        n = min(n, self.max_jobs - self.claimed_total)
                        if n <= 0:  # claimed all it may: stop once they are done
                            while self.free < self.threads and not self.stop_event.is_set():
                                self.cond.wait(0.5)
                            self.stop()
                            break
                    finished, self.finished = self.finished, []
                if self.stop_event.is_set():
                    self._to_completer(finished)
                    break
                self.wake.clear()
                # A burst may end only if nothing was running when this look began: a job that
                # finishes meanwhile may have enqueued another.
                busy = self.free < self.threads or bool(self.held)
                now = int(time.time())
                token = claim_token()
                try:
                    done, claimed = db(lambda s: s.finish_and_claim(finished, token, now, now + lease, self.queues,
                                                                    n, probe_first=idle), what="claiming")
                except DjangoDbError as exc:
                    self._to_completer(finished)
                    if not is_transient(exc):
                        self.fail(exc, "claiming")
                    break  # a permanent error, or stopping
                if finished:
                    self._settle(finished, done)
                idle = not claimed
                if claimed and self.stop_event.is_set():
                    self._hand_back(claimed, "claimed as the worker stopped")
                    break
                if claimed:
                    self.claimed_total += len(claimed)
                    with self.cond:
                        self.free -= len(claimed)
                    with self.held_lock:
                        for job in claimed:
                            self.held[(job.token, job.id)] = job
                    for job in claimed:
                        self.work.put(job)
                    continue
                if self.burst:
                    with self.cond:
                        if not busy and self.free == self.threads:
                            self.stop()  # nothing due and nothing running
                            break
                        self.cond.wait(self.poll_interval)  # a running job may enqueue more
                    continue
                # Woken by a hint (NOTIFY, a job enqueued in this process, another process's
                # write on SQLite), claim straight away; after a plain poll interval, look with
                # read-only statements first.
                idle = not self._idle_wait(holder)
        finally:
            with self.cond:
                self.riding = False
                left, self.finished = self.finished, []
            self._to_completer(left)
            holder.close()

    def _to_completer(self, jobs: list[Claimed]) -> None:
        for job in jobs:
            self.results.put((job, None, None))

    def _idle_wait(self, holder: ConnectionHolder) -> bool:
        """Wait until woken or POLL_INTERVAL passes; True when woken by a hint. On SQLite, also
        until another connection commits to the file: ``PRAGMA data_version`` tells without
        reading a table, so an idle worker notices new jobs within milliseconds for next to nothing."""
        if self.vendor != "sqlite":
            return self.wake.wait(self.poll_interval)
        deadline = time.monotonic() + self.poll_interval
        try:
            with holder.store().conn.cursor() as c:
                c.execute("PRAGMA data_version")
                version = c.fetchone()[0]
                while not self.wake.wait(min(SQLITE_WATCH_INTERVAL, max(deadline - time.monotonic(), 0))):
                    if time.monotonic() >= deadline:
                        return False
                    c.execute("PRAGMA data_version")
                    if c.fetchone()[0] != version:
                        return True
                return True
        except DjangoDbError:
            holder.reset()
            return self.wake.wait(max(deadline - time.monotonic(), 0))

    def _execute_loop(self) -> None:
        name = threading.current_thread().name
        try:
            while True:
                job = self.work.get()
                if job is None:
                    return
                self.executing[name] = job
                fatal: BaseException | None = None
                error: str | None = None
                tb: str | None = None
                try:
                    error, tb = execute(job)
                except BaseException as exc:
                    # SystemExit and the like: record the failure, then let this thread die (the
                    # supervisor replaces it).
                    fatal, error, tb = exc, describe(exc), traceback.format_exc()
                finally:
                    self.executing.pop(name, None)
                    with self.cond:
                        ride = error is None and self.riding
                        if ride:
                            self.finished.append(job)
                        else:
                            self.results.put((job, error, tb))
                        self.free += 1
                        self.cond.notify_all()
                    if ride:
                        self.wake.set()  # an idle dispatcher deletes it now, not after its poll interval
                if fatal is not None:
                    raise fatal
        finally:
            connections.close_all()

    def _complete_loop(self) -> None:
        holder = ConnectionHolder(self.alias)
        db = DatabaseRetry(holder, self.stop_event)
        try:
            while True:
                batch = [self.results.get()]
                while True:
                    try:
                        batch.append(self.results.get_nowait())
                    except queue.Empty:
                        break
                items = [b for b in batch if b is not None]
                if items:
                    self._record(db, items)
                    close_old_connections()  # job_dead receivers may have used Django's connection
                if len(items) < len(batch):
                    return
        finally:
            holder.close()
            connections.close_all()

    def _record(self, db: DatabaseRetry, items: list[tuple[Claimed, str | None, str | None]]) -> None:
        # Keep trying while the leases may still be ours; after that, recovery runs them again.
        deadline = time.monotonic() + float(jobs_settings.LEASE_SECONDS)
        outcomes: list[str] = []
        try:
            succeeded = [job for job, error, _ in items if error is None]
            if succeeded:
                done = db(lambda s: s.complete_many(succeeded), until=deadline, what="recording finished jobs")
                outcomes += self._outcomes(succeeded, done)
            for job, error, tb in items:
                if error is not None:
                    outcomes.append(self._record_failure(db, deadline, job, error, tb))
        except DjangoDbError as exc:
            logger.error("could not record %d job outcome(s): %s; their leases will expire and "
                         "another worker will run them again", len(items), exc)
        except Exception:  # a bug must not kill the completer with every later outcome waiting
            logger.exception("could not record %d job outcome(s); their leases will expire and "
                             "another worker will run them again", len(items))
        finally:
            self._let_go([job for job, _, _ in items])
        for outcome in outcomes:
            self.stats.add(outcome)

    @staticmethod
    def _record_failure(db: DatabaseRetry, deadline: float, job: Claimed, error: str, tb: str | None) -> str:
        """Record one failure; one that cannot be recorded is logged and dropped (its lease
        expires and recovery runs the job again), and the other outcomes go on."""
        call = lambda fn: db(fn, until=deadline, what=f"recording job {job.id}")  # noqa: E731
        try:
            return record_or_fallback(call, job, error, tb)
        except Exception:
            logger.exception("could not record the failure of job %s (%s); its lease will expire and "
                             "another worker will run it again", job.id, job.job_type)
            return "lost"

    @staticmethod
    def _outcomes(succeeded: list[Claimed], done: set[str]) -> list[str]:
        outcomes = []
        for job in succeeded:
            if job.id in done:
                outcomes.append("done")
            else:
                outcomes.append("lost")
                logger.warning("job %s (%s): result 'done' dropped: claim %s no longer holds it "
                               "(its lease expired and another worker took it over)",
                               job.id, job.job_type, job.token)
        return outcomes

    def _settle(self, succeeded: list[Claimed], done: set[str]) -> None:
        """Count finished jobs the dispatcher deleted with its claim, and let go of them."""
        outcomes = self._outcomes(succeeded, done)
        self._let_go(succeeded)
        for outcome in outcomes:
            self.stats.add(outcome)

    def _let_go(self, jobs: list[Claimed]) -> None:
        """Stop holding ``jobs``: the keeper no longer renews their leases."""
        with self.held_lock:
            for job in jobs:
                self.held.pop((job.token, job.id), None)

    def _keeper_loop(self) -> None:
        """Renew the leases of held jobs; take back expired ones from lost workers."""
        holder = ConnectionHolder(self.alias)
        db = DatabaseRetry(holder, self.stop_event)
        lease = int(jobs_settings.LEASE_SECONDS)
        renew_every = max(lease / 3, 0.2)
        next_recovery = time.monotonic() + jobs_settings.recovery_interval
        try:
            while not self._keeper_stop.wait(renew_every):
                try:
                    with self.held_lock:
                        tokens = sorted({token for token, _ in self.held})
                    if tokens:
                        db(lambda s: s.renew(tokens, int(time.time()) + lease), until=time.monotonic(),
                           what="renewing leases")
                    if time.monotonic() >= next_recovery and not self.stop_event.is_set():
                        db(lambda s: recover(s), until=time.monotonic(), what="recovering expired leases")
                        next_recovery = time.monotonic() + jobs_settings.recovery_interval
                except DjangoDbError as exc:
                    if not is_transient(exc):
                        self.fail(exc, "renewing leases")
                    continue  # logged by DatabaseRetry; the next round tries again
                except Exception:
                    logger.exception("lease keeper error")
        finally:
            holder.close()
            connections.close_all()

    def _scheduler_loop(self) -> None:
        from .schedules import scheduler_loop

        scheduler_loop(self.stop_event, self.alias)

    def _listen_loop(self) -> None:
        from .listen import listen_loop

        listen_loop(self.stop_event, self.wake, self.alias)

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
        self._started[name] = time.monotonic()
        t.start()

    def install_signal_handlers(self) -> None:
        def handler(signum: int, frame: Any) -> None:
            self._signals += 1
            if self._signals > 1:
                # Leases of running jobs expire and another worker's recovery takes them.
                os.write(2, b"second signal: exiting now\n")
                os._exit(1)
            self.stop()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def _roles(self) -> dict[str, Callable[[], None]]:
        roles: dict[str, Callable[[], None]] = {f"rws-job-{i}": self._execute_loop for i in range(self.threads)}
        roles["rws-dispatcher"] = self._dispatch_loop
        roles["rws-completer"] = self._complete_loop
        roles["rws-keeper"] = self._keeper_loop
        if self.run_schedules and not self.burst:
            roles["rws-scheduler"] = self._scheduler_loop
        if self.vendor == "postgresql" and not self.burst:
            roles["rws-listener"] = self._listen_loop
        return roles

    def run(self) -> int:
        """Run until stopped (or, with burst, until nothing is due). Returns the exit code."""
        from . import wakeup

        self._keeper_stop = threading.Event()
        holder = ConnectionHolder(self.alias)
        try:
            taken = DatabaseRetry(holder, self.stop_event)(lambda s: recover(s), what="recovering at start")
            if taken:
                logger.warning("took back %d job(s) whose worker was lost", taken)
        except DjangoDbError as exc:
            if not is_transient(exc):
                self.fail(exc, "the worker's first statement")
                return self.exit_code
            if self.stop_event.is_set():  # stopped while the database was unreachable
                logger.info("worker stopped before it started: the database was unreachable")
                return self.exit_code
            raise
        finally:
            holder.close()
        if self.burst and self.run_schedules:
            # A burst worker ticks its schedules once, before it looks for due jobs, so what they
            # enqueue runs in this burst.
            from .schedules import tick_schedules

            try:
                tick_schedules(using=self.alias)
            finally:
                connections.close_all()
        roles = self._roles()
        for name, target in roles.items():
            self._spawn(name, target)
        wakeup.listeners.add(self.wake)
        deaths: dict[str, int] = {}  # role -> deaths in a row, each soon after its start
        restart_at: dict[str, float] = {}  # role -> when its dead thread is replaced
        try:
            while not self.stop_event.wait(0.5):
                now = time.monotonic()
                for name, t in list(self._threads.items()):
                    if t.is_alive() or name in restart_at:
                        continue
                    # A thread that keeps dying (a broken database driver, a bug) is restarted
                    # later each time, instead of twice a second for ever.
                    deaths[name] = deaths.get(name, 0) + 1 if now - self._started[name] < RESPAWN_QUICK else 1
                    delay = min(2.0 ** (deaths[name] - 2), RESPAWN_DELAY_MAX) if deaths[name] > 1 else 0.0
                    logger.error("worker thread %s stopped; starting a new one%s", name,
                                 f" in {delay:g}s (it stopped {deaths[name]} times in a row)" if delay else "")
                    restart_at[name] = now + delay
                for name, at in list(restart_at.items()):
                    if now >= at:
                        del restart_at[name]
                        self._spawn(name, roles[name])
        finally:
            wakeup.listeners.discard(self.wake)
        return self._shutdown()

    def _hand_back(self, jobs: list[Claimed], why: str) -> None:
        """Release claimed jobs without charging an attempt (fenced on their claim)."""
        holder = ConnectionHolder(self.alias)
        try:
            for job in jobs:
                try:
                    if holder.store().release(job):
                        logger.warning("job %s (%s) handed back: %s", job.id, job.job_type, why)
                except DjangoDbError as exc:
                    logger.error("could not hand back job %s: %s; its lease will expire", job.id, exc)
                    holder.reset()
        finally:
            holder.close()
            self._let_go(jobs)

    def _shutdown(self) -> int:
        timeout = float(jobs_settings.SHUTDOWN_TIMEOUT)
        if self.executing:
            logger.info("stopping: waiting up to %ss for %d running job(s)", timeout, len(self.executing))
        deadline = time.monotonic() + timeout
        # A claim under way finishes (and hands back what it got) before the executors are told.
        self._threads["rws-dispatcher"].join(max(timeout, 35))
        for _ in range(self.threads):
            self.work.put(None)
        for name, t in self._threads.items():
            if name.startswith("rws-job-") or name == "rws-scheduler":
                t.join(max(deadline - time.monotonic(), 0))
        # Record what finished, then stop renewing leases.
        self.results.put(None)
        self._threads["rws-completer"].join(max(float(jobs_settings.LEASE_SECONDS), 10))
        self._keeper_stop.set()
        for name in ("rws-keeper", "rws-listener"):
            if name in self._threads:
                self._threads[name].join(5)
        # Last: jobs whose handlers are still running are handed back, and the process exits at
        # once, so they are not run here any further while another worker may take them.
        with self.held_lock:
            unfinished = list(self.executing.values())
        while True:  # claimed but never started (only if executors are stuck)
            try:
                job = self.work.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                unfinished.append(job)
        if unfinished:
            self._hand_back(unfinished, f"interrupted: it did not finish within SHUTDOWN_TIMEOUT ({timeout:g}s)")
        logger.info("worker stopped: %d done, %d retried, %d dead, %d results dropped",
                    self.stats.done, self.stats.retried, self.stats.dead, self.stats.lost)
        return self.exit_code
