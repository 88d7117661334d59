"""python manage.py rws_queues [list] | pause NAME... | resume NAME...: the queues, their counts
and pauses."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_rws_jobs.admin.overview import queue_stats, shown
from django_rws_jobs.admin.waits import limits_text
from django_rws_jobs.database import clock
from django_rws_jobs.database.connections import queue_alias
from django_rws_jobs.database.validation import queue_name
from django_rws_jobs.flow.limits import configured
from django_rws_jobs.flow.pauses import pause_queue, resume_queue
from django_rws_jobs.management import QueueCommand, setting_default
from django_rws_jobs.models import Queue

COLUMNS = ("QUEUE", "STATE", "LIMITS", "WAITING", "DUE", "LATER", "RUNNING", "FAILED")


class Command(QueueCommand):
    help = (
        "List the queues with their counts and whether they are paused, or pause or resume queues. "
        "A paused queue's jobs wait, on every worker, until it is resumed; running jobs finish."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--database", default=None, help=f"database alias (default: {setting_default('DATABASE')})"
        )
        # No subcommand lists the queues, as ``list`` does
        # (tests/test_pauses.py::test_rws_queues_alone_lists_the_queues).
        actions = parser.add_subparsers(
            dest="action",
            required=False,
            metavar="{list,pause,resume}",
            help="what to do (default: list)",
        )
        actions.add_parser(
            "list",
            help="each queue: paused or not, its limits, and its jobs waiting for a concurrency key, "
            "due, due later, running and failed (the default)",
        )
        for verb in ("pause", "resume"):
            sub = actions.add_parser(verb, help=f"{verb} the named queues")
            sub.add_argument("names", nargs="+", metavar="NAME")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            alias = queue_alias(options["database"])
            if options["action"] in (None, "list"):
                self._list(alias)
                return
            names = [queue_name(n) for n in options["names"]]
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        change = pause_queue if options["action"] == "pause" else resume_queue
        for name in names:
            change(name, using=alias)
            self.stdout.write(f"{options['action']}d {name}")

    def _list(self, alias: str) -> None:
        at = int(clock.now(alias))
        stats = {s.queue: s for s in queue_stats(at, using=alias)}
        paused = dict(Queue.objects.using(alias).values_list("name", "paused"))
        limits = configured()
        names = sorted(set(stats) | {name for name, p in paused.items() if p} | set(limits))
        if not names:
            self.stdout.write("No queues: no job is stored, none is paused and none has limits.")
            return
        rows: list[tuple[str, ...]] = [COLUMNS]
        for name in names:
            s = stats.get(name)
            fields = ("waiting", "due", "later", "running", "failed")
            counts = [shown(getattr(s, f)) if s else "0" for f in fields]
            state = "paused" if paused.get(name) else "active"
            rows.append((name, state, limits_text(limits.get(name)), *counts))
        widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
        for r in rows:
            self.stdout.write("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
