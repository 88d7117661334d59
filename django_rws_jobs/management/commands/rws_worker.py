"""python manage.py rws_worker: run job worker threads until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import select
import signal
import sys
import threading
import time
from typing import Any

from django.core.checks import Tags
from django.core.management.base import CommandError, CommandParser
from django.utils import autoreload

from django_rws_jobs.checks import check_value
from django_rws_jobs.conf import jobs_settings
from django_rws_jobs.database.connections import queue_alias
from django_rws_jobs.database.validation import queue_list
from django_rws_jobs.management import QueueCommand, setting_default

# Imported here, before --processes forks: a child that had to import the worker after the fork
# would take longer to install its signal handlers, and a SIGTERM passed on in that time would kill
# it with no graceful stop
# (tests/test_worker.py::test_processes_option_shares_the_work_and_stops_cleanly).
from django_rws_jobs.worker import Worker
from django_rws_jobs.worker.supervisor import print_stacks

#: Seconds between the children's thread dumps (SIGUSR1 to the parent of --processes).
DUMP_GAP = 0.5
#: The signals the parent of --processes passes on to its children.
FORWARDED = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGUSR1})


def _positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of at least 1")
    return n


def _queues(value: str | None) -> list[str] | None:
    """The names in ``--queues a,b``; given and naming none (``''``, ``,,``, an unset
    ``$QUEUES``) it is an error, not every queue.
    (tests/test_input.py::test_rws_worker_refuses_a_blank_queue_list)"""
    if value is None:
        return None
    names = [q.strip() for q in value.split(",") if q.strip()]
    if not names:
        raise ValueError(f"--queues {value!r} names no queue; leave --queues out to run every queue")
    return queue_list(names)


def _add_capacity_arguments(parser: CommandParser) -> None:
    """How many workers run, and on which queues."""
    parser.add_argument(
        "--workers", "-w", type=_positive_int, default=1, help="worker threads per process (default: 1)"
    )
    parser.add_argument(
        "--processes",
        "-p",
        type=_positive_int,
        default=1,
        help="worker processes, each with --workers threads, to use several cores (default: 1)",
    )
    parser.add_argument(
        "--queues",
        "-q",
        default=None,
        help="comma-separated queues to run, at least one (default: every queue)",
    )


def _add_pool_arguments(parser: CommandParser) -> None:
    """Where handlers run, and when a child process is replaced."""
    parser.add_argument(
        "--pool",
        choices=["threads", "processes"],
        default="threads",
        help="where handlers run: in the worker's threads, or each executor's in a child process, which "
        "a timeout, a crash or a limit below replaces (default: threads)",
    )
    parser.add_argument(
        "--max-jobs-per-child",
        type=_positive_int,
        default=None,
        help="with --pool processes: replace a child after this many jobs (default: no limit)",
    )
    parser.add_argument(
        "--max-memory-per-child",
        type=_positive_int,
        default=None,
        metavar="MB",
        help="with --pool processes: replace a child once its peak memory passes this many MB "
        "(default: no limit)",
    )


def _add_run_arguments(parser: CommandParser) -> None:
    """When the worker stops, how long it waits when idle, and whether it runs the cron schedules."""
    parser.add_argument("--burst", action="store_true", help="exit 0 once nothing is due")
    parser.add_argument(
        "--max-jobs",
        type=_positive_int,
        default=None,
        help="stop after this many jobs (per process; default: no limit)",
    )
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=None,
        help="seconds an idle worker waits before looking again (default: "
        f"{setting_default('POLL_INTERVAL')})",
    )
    parser.add_argument(
        "--schedules",
        dest="schedules",
        action="store_true",
        default=None,
        help="run cron schedules (default: on, off with --burst)",
    )
    parser.add_argument(
        "--no-schedules",
        dest="schedules",
        action="store_false",
        help="do not run cron schedules in this process",
    )
    parser.add_argument(
        "--heartbeat-file",
        default=None,
        metavar="PATH",
        help="touch this file once a heartbeat interval while the worker's roles make progress, for "
        "`rws_health --heartbeat-file PATH` (a liveness probe that needs no database; default: none)",
    )
    parser.add_argument(
        "--reload",
        action="store_true",
        help="for development: restart the worker when a Python file of the project changes, as "
        "runserver does (Django's autoreloader); one process only",
    )


class Command(QueueCommand):
    help = "Run django-rws-jobs workers: claim due jobs, run them, retry failures, enqueue cron jobs."
    requires_system_checks = [Tags.models, "rws_jobs"]

    def add_arguments(self, parser: CommandParser) -> None:
        _add_capacity_arguments(parser)
        _add_pool_arguments(parser)
        _add_run_arguments(parser)
        parser.add_argument(
            "--database", default=None, help=f"database alias (default: {setting_default('DATABASE')})"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self._configure_logging(options["verbosity"])
        try:
            queues = _queues(options["queues"])
            if options["poll_interval"] is not None:
                check_value("POLL_INTERVAL", options["poll_interval"], "--poll-interval")
            alias = queue_alias(options["database"])
        except (TypeError, ValueError) as exc:
            raise CommandError(str(exc)) from None
        settings = dict(
            threads=options["workers"],
            queues=queues,
            burst=options["burst"],
            max_jobs=options["max_jobs"],
            poll_interval=options["poll_interval"],
            schedules=options["schedules"],
            using=alias,
            pool=options["pool"],
            max_jobs_per_child=options["max_jobs_per_child"],
            max_memory_per_child=options["max_memory_per_child"],
            heartbeat_file=options["heartbeat_file"],
        )
        if options["pool"] == "threads" and (
            options["max_jobs_per_child"] or options["max_memory_per_child"]
        ):
            raise CommandError("--max-jobs-per-child and --max-memory-per-child need --pool processes")
        if options["reload"]:
            if options["processes"] > 1:
                raise CommandError("--reload runs one process: leave out --processes")
            autoreload.run_with_reloader(self._run_reloaded, settings)
            return
        if options["processes"] > 1:
            code = self._run_processes(options["processes"], settings)
        else:
            code = self._run_worker(settings)
        if code:
            sys.exit(code)

    def _run_worker(self, settings: dict[str, Any], unblock: frozenset[int] = frozenset()) -> int:
        """Run one worker. ``unblock``: the signals a ``--processes`` child inherits blocked, let
        through once its own handlers are set, so one sent earlier waits instead of killing it."""
        worker = Worker(**settings)
        worker.install_signal_handlers()
        # SIGUSR1 prints every thread's stack to stderr: a wedged worker explains itself
        # (tests/test_worker.py::test_sigusr1_prints_every_threads_stack).
        signal.signal(signal.SIGUSR1, print_stacks)
        if unblock:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, unblock)
        return worker.run()

    def _run_reloaded(self, settings: dict[str, Any]) -> None:
        """Run one worker in the thread Django's autoreloader starts for it; its main thread watches
        the files and exits (code 3, and the parent starts a new process) when one changes. The
        worker then stops as on SIGTERM before the process ends: running jobs finish within
        SHUTDOWN_TIMEOUT or are handed back. A worker that stops by itself (``--burst``,
        ``--max-jobs``, a fatal error) ends the process with its exit code
        (tests/test_worker.py::test_reload_restarts_the_worker_when_a_python_file_changes)."""
        worker = Worker(**settings)
        done = threading.Event()
        exiting = threading.Event()

        def stop_before_exit() -> None:
            exiting.set()
            worker.stop()
            done.wait(float(jobs_settings.SHUTDOWN_TIMEOUT) + 60)

        atexit.register(stop_before_exit)
        try:
            code = worker.run()
        finally:
            done.set()
        if not exiting.is_set():
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def _run_processes(self, count: int, settings: dict[str, Any]) -> int:
        """Fork ``count`` worker processes and pass signals on to them; exit 0 if they all did.

        The parent runs no Python signal handler of its own: the signals it passes on wake its
        main loop through a pipe (signal.set_wakeup_fd), which reaps the children too. A child
        whose parent is gone stops as on SIGTERM (Worker's ``parent_pid``), so a ``kill -9`` of
        the parent leaves no worker running unwatched
        (tests/test_worker.py::test_children_of_a_killed_parent_stop)."""
        from django.db import connections

        connections.close_all()  # a forked child must not share its parent's sockets
        parent = os.getpid()
        # Blocked before the forks: each child lets them through once its handlers are set, the
        # parent once its pipe is.
        signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
        children: list[int] = []
        for index in range(count):
            pid = os.fork()
            if pid == 0:
                # Its own process group: a Ctrl-C or a service manager's group-wide signal reaches
                # the parent only, which passes it on once (a child counts a second as "now").
                os.setpgrp()
                code = 1
                try:
                    # One process runs the schedules (they are once-per-due-time anyway).
                    child = {
                        **settings,
                        "schedules": settings["schedules"] if index == 0 else False,
                        "parent_pid": parent,
                    }
                    code = self._run_worker(child, unblock=FORWARDED)
                except BaseException:
                    logging.getLogger("django_rws_jobs").exception("worker process %d failed", index)
                finally:
                    logging.shutdown()
                    os._exit(code)
            children.append(pid)
        return _supervise_children(children)

    def _configure_logging(self, verbosity: int) -> None:
        logger = logging.getLogger("django_rws_jobs")
        level = {0: logging.ERROR, 1: logging.INFO, 2: logging.DEBUG}.get(verbosity, logging.DEBUG)
        if not logger.handlers and not logging.getLogger().handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s [%(threadName)s] %(message)s"))
            logger.addHandler(handler)
            logger.propagate = False
        logger.setLevel(level)


def _supervise_children(children: list[int]) -> int:
    """The parent's loop: pass on each signal of FORWARDED (SIGUSR1 to one child after the other,
    DUMP_GAP apart, so their thread dumps do not interleave on a shared stderr) and reap the
    children. Returns 0 if every child exited 0, else the first other exit code (1 for a child
    killed by a signal)."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    for signum in FORWARDED:
        signal.signal(signum, lambda signum, frame: None)  # the wake-up pipe carries it
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    live = list(children)
    code = 0
    while live:
        ready, _, _ = select.select([wake_r], [], [], 0.5)
        for received in os.read(wake_r, 64) if ready else b"":
            for i, pid in enumerate(list(live)):
                if received == signal.SIGUSR1 and i:
                    time.sleep(DUMP_GAP)
                try:
                    os.kill(pid, received)
                except ProcessLookupError:
                    pass
        for pid in list(live):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                live.remove(pid)  # reaped: its pid may be reused, never signal it again
                child_code = os.waitstatus_to_exitcode(status)
                code = code or (child_code if child_code > 0 else 1 if child_code < 0 else 0)
    return code
