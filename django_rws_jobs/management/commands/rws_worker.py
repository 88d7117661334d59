"""python manage.py rws_worker: run job worker threads until SIGTERM/SIGINT."""

from __future__ import annotations

import logging
import sys
from typing import Any

from django.core.checks import Tags
from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_rws_jobs.conf import jobs_settings
from django_rws_jobs.db import queue_alias


def _positive_int(value: str) -> int:
    n = int(value)
    if n < 1:
        raise ValueError(value)
    return n


class Command(BaseCommand):
    help = "Run django-rws-jobs workers: claim due jobs, run them, retry failures, enqueue cron jobs."
    requires_system_checks = [Tags.models, "rws_jobs"]  # type: ignore[list-item]

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--workers", "-w", type=_positive_int, default=1, help="worker threads (default 1)")
        parser.add_argument("--queues", "-q", default="", help="comma-separated queues to run (default: all)")
        parser.add_argument("--burst", action="store_true", help="exit 0 once nothing is due")
        parser.add_argument("--max-jobs", type=_positive_int, default=None, help="stop after this many jobs")
        parser.add_argument("--poll-interval", type=float, default=None,
                            help="seconds an idle worker waits before looking again (default: POLL_INTERVAL)")
        parser.add_argument("--schedules", dest="schedules", action="store_true", default=None,
                            help="run cron schedules (default: on, off with --burst)")
        parser.add_argument("--no-schedules", dest="schedules", action="store_false",
                            help="do not run cron schedules in this process")
        parser.add_argument("--database", default=None, help="database alias (default: RWS_JOBS['DATABASE'])")

    def handle(self, *args: Any, **options: Any) -> None:
        from django_rws_jobs.worker import Worker, worker_id

        self._configure_logging(options["verbosity"])
        queues = [q.strip() for q in options["queues"].split(",") if q.strip()] or None
        if options["poll_interval"] is not None and options["poll_interval"] <= 0:
            raise CommandError(f"--poll-interval {options['poll_interval']} must be greater than 0")
        try:
            alias = queue_alias(options["database"])
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        worker = Worker(
            threads=options["workers"], queues=queues, burst=options["burst"], max_jobs=options["max_jobs"],
            poll_interval=options["poll_interval"], schedules=options["schedules"], using=alias,
        )
        worker.install_signal_handlers()
        logging.getLogger("django_rws_jobs").info(
            "worker %s starting: %d thread(s), queues %s, database %r, lease %ss%s%s",
            worker_id(), worker.threads,
            ",".join(queues) if queues else "(all)", alias, jobs_settings.LEASE_SECONDS,
            ", burst" if worker.burst else "", ", schedules on" if worker.run_schedules else "",
        )
        code = worker.run()
        if code:
            sys.exit(code)

    def _configure_logging(self, verbosity: int) -> None:
        logger = logging.getLogger("django_rws_jobs")
        level = {0: logging.ERROR, 1: logging.INFO, 2: logging.DEBUG}.get(verbosity, logging.DEBUG)
        if not logger.handlers and not logging.getLogger().handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s [%(threadName)s] %(message)s"))
            logger.addHandler(handler)
            logger.propagate = False
        logger.setLevel(level)
