"""The supervisor: starts a worker's roles, restarts the ones that die, and shuts down."""

from __future__ import annotations

import logging
import math
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

from django.db import Error as DatabaseError
from django.db import connections

from ..attempts.outcomes import recover
from ..checks import check_value, require_valid_settings
from ..conf import jobs_settings
from ..database import clock, wakeup
from ..database.backends import backend_for
from ..database.connections import is_transient, queue_alias
from ..database.validation import INT32_MAX, INT64_MAX, integer, queue_list
from ..operations.worker_rows import DEAD_AFTER, Registration, heartbeat_interval, touch
from ..queue.ids import worker_id
from ..queue.store import Claimed
from ..schedules.ticks import tick_schedules
from .cancels import CancelWatcher
from .completer import Completer, record_late_outcomes
from .dispatcher import Dispatcher
from .executor import Executor
from .keeper import LeaseKeeper
from .listener import Listener, listen_alias
from .reconnect import Connection, Retry
from .scheduler import Scheduler
from .shared import Shared
from .timeouts import Watchdog

logger = logging.getLogger("django_rws_jobs")

#: A role thread that dies again within this many seconds of its start is restarted later each
#: time: 1 s, 2 s, 4 s ... up to RESPAWN_DELAY_MAX
#: (tests/test_worker.py::test_a_thread_that_keeps_dying_is_restarted_later_each_time).
RESPAWN_QUICK = 10.0
RESPAWN_DELAY_MAX = 30.0
#: The roles whose turns keep the heartbeat file fresh (shared.Progress). Executors are not among
#: them: one runs a job (its time limit covers it) or waits for one. Nor are the listener, a
#: wake-up hint the dispatcher's polling stands in for, and the cancel watcher.
WATCHED = frozenset(
    {Dispatcher.ROLE, Completer.ROLE, LeaseKeeper.ROLE, Scheduler.ROLE, Watchdog.ROLE, CancelWatcher.ROLE}
)


def print_stacks(signum: int, frame: Any) -> None:
    """SIGUSR1's handler: write every thread's stack to stderr, then go on.

    It runs in the main thread as Python code and reads the other threads' frames as Python
    objects, under the GIL: a thread that moves on meanwhile gives a stale line, never a crash.
    faulthandler's C handler, which walks the frames without the GIL while their threads run,
    crashed busy workers with SIGSEGV (tests/test_worker.py::test_sigusr1_never_kills_a_busy_worker).
    It takes no lock (the main thread may hold any when the signal arrives) and writes to file
    descriptor 2 itself, not through sys.stderr, whose buffer a write the signal interrupted may
    hold.
    """
    chunks = []
    for ident, top in sys._current_frames().items():
        chunks.append(f"Thread {ident:#x} (most recent call first):\n")
        f: FrameType | None = top
        while f is not None:
            chunks.append(f'  File "{f.f_code.co_filename}", line {f.f_lineno} in {f.f_code.co_name}\n')
            f = f.f_back
        chunks.append("\n")
    data = "".join(chunks).encode("utf-8", "backslashreplace")
    while data:
        try:
            data = data[os.write(2, data) :]
        except InterruptedError:
            continue
        except OSError:
            return  # stderr is gone: nothing to tell


class Worker:
    """One worker process: a dispatcher, N executors, a completer, a lease keeper, a scheduler
    and, on PostgreSQL, a listener, each a thread, sharing one :class:`Shared`."""

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
        pool: str = "threads",
        max_jobs_per_child: int | None = None,
        max_memory_per_child: int | None = None,
        heartbeat_file: str | None = None,
        parent_pid: int | None = None,
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
        self.features = backend_for(connections[self.alias]).features
        self.deletes_with_claim = False  # features.deletes_with_claim, read at the start (run)
        self.shared = Shared(self.alias, self.threads)
        self.pool = None  # the thread pool; the process pool (and multiprocessing) loads for its own use
        if (pool, max_jobs_per_child, max_memory_per_child) != ("threads", None, None):
            from .pool import make_pool  # (the process pool only: it loads multiprocessing)

            self.pool = make_pool(pool, max_jobs_per_child, max_memory_per_child, self.alias)
        self.registration = Registration(worker_id(), self.queues, pool, self.threads, heartbeat_interval())
        self.heartbeat_file = heartbeat_file
        #: The pid of the process that started this one (rws_worker --processes): once it is gone
        #: this worker stops as on SIGTERM.
        self.parent_pid = parent_pid
        self._touched = -math.inf  # time.monotonic() of the heartbeat file's last touch
        self._stalled: frozenset[str] = frozenset()  # the roles past the bound, as last logged
        self._threads: dict[str, threading.Thread] = {}
        self._started: dict[str, float] = {}  # role -> time.monotonic() of its thread's start
        self._signals = 0
        self._warned_offset: float | None = None  # see clock.warn_if_off

    @property
    def exit_code(self) -> int:
        return self.shared.exit_code

    def stop(self) -> None:
        """Stop as on SIGTERM: claim no more, ask running jobs to stop (current_job().stopping,
        iterate's hand-back: in the process pool's children too, by SIGUSR1), let the others
        finish within SHUTDOWN_TIMEOUT."""
        self.shared.interrupt.set()
        if self.pool is not None:
            self.pool.kill_all(signal.SIGUSR1)
        self.shared.stop_all()

    def install_signal_handlers(self) -> None:
        """The first SIGTERM or SIGINT stops gracefully; a second exits at once (leases of running
        jobs expire and another worker's recovery takes them)."""

        def handler(signum: int, frame: Any) -> None:
            self._signals += 1
            if self._signals > 1:
                os.write(2, b"second signal: exiting now\n")
                if self.pool is not None:
                    self.pool.kill_all()
                os._exit(1)
            # Not stop() here: Event.set takes the Event's lock, which the main thread may hold
            # inside stop.wait() when the signal arrives (tests/test_worker.py
            # test_a_signal_during_the_supervisors_wait_stops_the_worker).
            threading.Thread(target=self.stop, name="rws-stop", daemon=True).start()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def run(self) -> int:
        """Run until stopped (or, with burst, until nothing is due). Returns the exit code."""
        if not self._recover_at_start():
            return self.exit_code
        if self.burst and self.run_schedules:
            # A burst worker ticks its schedules once, before it looks for due jobs, so what they
            # enqueue runs in this burst.
            try:
                tick_schedules(using=self.alias)
            finally:
                connections.close_all()
        self._keeper = LeaseKeeper(self.shared, self.registration)
        self._keeper.warned_offset = self._warned_offset
        self._watchdog = Watchdog(self.shared, float(jobs_settings.TIMEOUT_GRACE))
        self._cancels = CancelWatcher(self.shared)
        if self.pool is not None:
            self.pool.prestart(self.threads)
        roles = self._roles()
        for name, target in roles.items():
            self._spawn(name, target)
        wakeup.listeners.add(self.shared.wake)
        try:
            self._supervise(roles)
        finally:
            wakeup.listeners.discard(self.shared.wake)
        return self._shutdown()

    def _recover_at_start(self) -> bool:
        """Take back the jobs of lost workers; False when the worker is not to start."""
        holder = Connection(self.alias)
        try:
            # What the dispatcher's deletions depend on is read here, on a connection of this
            # thread's (MariaDB's asks the server what it is).
            reading, taken, self.deletes_with_claim = Retry(holder, self.shared.stop).until_stopped(
                lambda c: (
                    clock.read(c.connection()),
                    recover(c.store()),
                    bool(c.store().features.deletes_with_claim),
                ),
                "recovering at start",
            )
            self._register(holder)
            clock.kept_fresh_by_caller()  # the lease keeper reads it from now on
            self._log_start(reading)
            if taken:
                logger.warning("took back %d job(s) whose worker was lost", taken)
        except DatabaseError as exc:
            if not is_transient(exc):
                self.shared.fail(exc, "the worker's first statement")
                return False
            if self.shared.stop.is_set():  # stopped while the database was unreachable
                logger.info("worker stopped before it started: the database was unreachable")
                return False
            raise
        finally:
            holder.close()
        return True

    def _register(self, holder: Connection) -> None:
        """Insert this worker's row once its recovery is done (worker_rows.py). A transient failure
        is left to the keeper's first heartbeat, which inserts a missing row; any other (no table
        rws_workers: the migrations) stops the worker as a missing rws_jobs does."""
        try:
            Retry(holder, self.shared.stop).once(
                lambda c: self.registration.register(c.store(), int(clock.now(self.alias))), "registering"
            )
        except DatabaseError as exc:
            if not is_transient(exc):
                raise

    def _log_start(self, reading: clock.Reading | None) -> None:
        """The start-up line, with the host's clock offset from the database's."""
        logger.info(
            "worker %s starting: %d %s, queues %s, database %r%s, lease %ss, %s%s%s",
            worker_id(),
            self.threads,
            "thread(s)" if self.pool is None else "child process(es)",
            ",".join(self.queues) if self.queues else "(all)",
            self.alias,
            self._wakeups(),
            jobs_settings.LEASE_SECONDS,
            clock.describe(reading),
            ", burst" if self.burst else "",
            ", schedules on" if self.run_schedules else "",
        )
        self._warned_offset = clock.warn_if_off(reading, None)

    def _wakeups(self) -> str:
        """How the start-up line says wake-ups reach this worker, where that is not the default."""
        if self.features.wakeup != "listen":
            return ""
        listen = listen_alias(self.alias)
        if listen is None:
            return f" (transaction pooler: polling every {self.poll_interval}s)"
        return "" if listen == self.alias else f" (LISTEN on {listen!r})"

    def _roles(self) -> dict[str, Callable[[], None]]:
        """Thread name -> the role's loop. A restarted thread runs a new role object."""
        shared = self.shared
        pool = self.pool
        if pool is None:
            roles: dict[str, Callable[[], None]] = {
                f"rws-job-{i}": lambda: Executor(shared, self._watchdog).loop() for i in range(self.threads)
            }
            roles[Watchdog.ROLE] = self._watchdog.loop
        else:
            from .pool import ProcessExecutor  # (the process pool only: it loads multiprocessing)

            roles = {
                f"rws-job-{i}": lambda: ProcessExecutor(shared, pool).loop() for i in range(self.threads)
            }
        roles[Dispatcher.ROLE] = lambda: Dispatcher(
            shared,
            self.features,
            deletes_with_claim=self.deletes_with_claim,
            queues=self.queues,
            burst=self.burst,
            max_jobs=self.max_jobs,
            poll_interval=self.poll_interval,
        ).loop()
        roles[Completer.ROLE] = lambda: Completer(shared).loop()
        roles[LeaseKeeper.ROLE] = self._keeper.loop
        roles[CancelWatcher.ROLE] = self._cancels.loop
        if self.run_schedules and not self.burst:
            roles[Scheduler.ROLE] = lambda: Scheduler(
                shared.stop, self.alias, shared.progress, shared.bookkeeping
            ).loop()
        listen = listen_alias(self.alias) if self.features.wakeup == "listen" else None
        if listen is not None and not self.burst:
            roles["rws-listener"] = lambda: Listener(shared.stop, shared.wake, listen).loop()
        return roles

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        def guarded() -> None:
            try:
                target()
            except BaseException:
                logger.exception("worker thread %s died", name)
                raise

        t = threading.Thread(target=guarded, name=name, daemon=True)
        self._threads[name] = t
        self._started[name] = time.monotonic()
        if name in WATCHED:
            self.shared.progress.turn(name)  # its start is a turn: one stuck before its first is seen
        t.start()

    def _supervise(self, roles: dict[str, Callable[[], None]]) -> None:
        """Until stopped, replace dead role threads; one that keeps dying (a broken database
        driver, a bug) is restarted later each time, instead of twice a second for ever."""
        deaths: dict[str, int] = {}  # role -> deaths in a row, each soon after its start
        restart_at: dict[str, float] = {}  # role -> when its dead thread is replaced
        self._touch_heartbeat_file()
        while not self.shared.stop.wait(0.5):
            if self.parent_pid is not None and os.getppid() != self.parent_pid:
                logger.error("the parent process %d is gone: stopping", self.parent_pid)
                self.stop()
                break
            self._touch_heartbeat_file()
            self._replace_abandoned(roles)
            now = time.monotonic()
            for name, t in list(self._threads.items()):
                if t.is_alive() or name in restart_at:
                    continue
                deaths[name] = deaths.get(name, 0) + 1 if now - self._started[name] < RESPAWN_QUICK else 1
                delay = min(2.0 ** (deaths[name] - 2), RESPAWN_DELAY_MAX) if deaths[name] > 1 else 0.0
                logger.error(
                    "worker thread %s stopped; starting a new one%s",
                    name,
                    f" in {delay:g}s (it stopped {deaths[name]} times in a row)" if delay else "",
                )
                restart_at[name] = now + delay
            for name, at in list(restart_at.items()):
                if now >= at:
                    del restart_at[name]
                    self._spawn(name, roles[name])

    def _touch_heartbeat_file(self) -> None:
        """Keep ``--heartbeat-file`` fresh, once a heartbeat interval, while every watched role
        began a turn within three heartbeat intervals (LEASE_SECONDS, the probe's own limit):
        ``rws_health --heartbeat-file`` tells a worker that makes progress without the database
        (tests/test_health.py::test_the_heartbeat_file_goes_stale_while_a_role_is_stuck)."""
        if self.heartbeat_file is None or time.monotonic() - self._touched < self.registration.interval:
            return
        bound = DEAD_AFTER * self.registration.interval
        stalled = self.shared.progress.stalled(bound)
        self._report_stalls(stalled, bound)
        if stalled:
            return
        try:
            touch(self.heartbeat_file)
            self._touched = time.monotonic()
        except OSError as exc:
            logger.error("could not touch the heartbeat file %s: %s", self.heartbeat_file, exc)

    def _report_stalls(self, stalled: list[tuple[str, float]], bound: float) -> None:
        """Log once (ERROR) each role that stops the heartbeat file's touches, and once that they
        all make progress again."""
        names = frozenset(role for role, _ in stalled)
        if names - self._stalled:
            logger.error(
                "heartbeat file %s no longer touched: %s, over %gs (LEASE_SECONDS): the worker is stuck",
                self.heartbeat_file,
                ", ".join(f"{role}'s last turn began {age:.1f}s ago" for role, age in stalled),
                bound,
            )
        elif self._stalled and not names:
            logger.warning("heartbeat file %s touched again: every role makes progress", self.heartbeat_file)
        self._stalled = names

    def _replace_abandoned(self, roles: dict[str, Callable[[], None]]) -> None:
        """Start a new executor thread in place of each one the watchdog abandoned (it runs on,
        unwatched, until its handler returns or the process exits)."""
        with self.shared.cond:
            abandoned, self.shared.abandoned = self.shared.abandoned, set()
        for name, t in list(self._threads.items()):
            if t.ident in abandoned:
                logger.warning("worker thread %s abandoned; starting a new one", name)
                self._spawn(name, roles[name])

    def _shutdown(self) -> int:
        """Let running jobs finish within SHUTDOWN_TIMEOUT, record their outcomes, stop renewing
        leases, and hand back what did not finish
        (tests/test_worker.py::test_sigterm_hands_back_what_does_not_finish_in_time)."""
        shared = self.shared
        timeout = float(jobs_settings.SHUTDOWN_TIMEOUT)
        if shared.executing:
            logger.info("stopping: waiting up to %ss for %d running job(s)", timeout, len(shared.executing))
        deadline = time.monotonic() + timeout
        # A claim under way finishes (and hands back what it got) before the executors are told.
        self._threads["rws-dispatcher"].join(max(timeout, 35))
        for _ in range(self.threads):
            shared.work.put(None)
        for name, t in self._threads.items():
            if name.startswith("rws-job-") or name == "rws-scheduler":
                t.join(max(deadline - time.monotonic(), 0))
        self._watchdog.close()
        # Record what finished, then stop renewing leases.
        shared.results.put(None)
        self._threads["rws-completer"].join(max(float(jobs_settings.LEASE_SECONDS), 10))
        self._keeper.done.set()
        self._cancels.done.set()
        for name in ("rws-keeper", "rws-listener", "rws-cancels"):
            if name in self._threads:
                self._threads[name].join(5)
        # Last: jobs whose handlers are still running are handed back, and the process exits at
        # once, so they are not run here any further while another worker may take them.
        record_late_outcomes(shared)
        unfinished = self._unfinished()
        if self.pool is not None and unfinished:
            # Their children go first, so a job handed back is not run here any further.
            self.pool.stop_running(self._threads.values())
        if unfinished:
            why = f"interrupted: it did not finish within SHUTDOWN_TIMEOUT ({timeout:g}s)"
            shared.hand_back(unfinished, why)
        record_late_outcomes(shared)
        self._unregister()
        stats = shared.stats
        logger.info(
            "worker stopped: %d done, %d retried, %d dead, %d snoozed, %d handed back to resume, "
            "%d results dropped, %d timed out, %d threads abandoned, %d child processes lost mid-job",
            stats.done,
            stats.retried,
            stats.dead,
            stats.snoozed,
            stats.interrupted,
            stats.lost,
            stats.timed_out,
            stats.abandoned,
            stats.children_lost,
        )
        return shared.exit_code

    def _unregister(self) -> None:
        """A clean stop removes the worker's row (a failure leaves it to die of age)."""
        holder = Connection(self.alias)
        try:
            Retry(holder, threading.Event()).once(
                lambda c: self.registration.remove(c.store()), "unregistering"
            )
        except DatabaseError as exc:
            logger.error("could not remove this worker's row from rws_workers: %s", exc)
        finally:
            holder.close()

    def _unfinished(self) -> list[Claimed]:
        """Jobs still running, and jobs claimed but never started (only if executors are stuck)."""
        with self.shared.held_lock:
            unfinished = list(self.shared.executing.values())
        while True:
            try:
                job = self.shared.work.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                unfinished.append(job)
        return unfinished
