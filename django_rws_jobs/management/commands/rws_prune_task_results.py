"""python manage.py rws_prune_task_results: delete old results of django.tasks tasks."""

from __future__ import annotations

import re
from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_rws_jobs.database.connections import queue_alias
from django_rws_jobs.database.validation import queue_list
from django_rws_jobs.management import QueueCommand, setting_default
from django_rws_jobs.tasks.prune import describe, policies, prune

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


#: The longest age --older-than takes: about 1,000 years, past any result's finished_at.
AGE_MAX = 1000 * 365 * 86400


def duration(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``15m``, ``12h`` or ``7d``, at most AGE_MAX."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if match is None:
        raise CommandError(f"--older-than {text!r}: give seconds or a number with s, m, h or d (e.g. 7d)")
    seconds = float(match.group(1)) * UNITS[match.group(2) or "s"]
    if not seconds <= AGE_MAX:
        raise CommandError(f"--older-than {text[:40]!r} is too long: the limit is {AGE_MAX} s (1000 years)")
    return seconds


class Command(QueueCommand):
    help = (
        "Delete the results of django.tasks tasks (rws_task_results) older than --older-than, by "
        "default each task backend's OPTIONS['RESULTS_RETENTION']."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            help="an age: seconds, or 15m, 12h, 7d (default: each task backend's "
            "OPTIONS['RESULTS_RETENTION'])",
        )
        parser.add_argument("--queues", help="comma-separated queue names (default: every queue)")
        parser.add_argument("--dry-run", action="store_true", help="count, delete nothing")
        parser.add_argument(
            "--database", default=None, help=f"database alias (default: {setting_default('DATABASE')})"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            alias = queue_alias(options["database"])
            queues = queue_list(options["queues"].split(",")) if options["queues"] is not None else None
        except (TypeError, ValueError) as exc:
            raise CommandError(str(exc)) from None
        dry_run = options["dry_run"]
        if options["older_than"] is not None:
            count = prune(alias, duration(options["older_than"]), queues=queues, dry_run=dry_run)
            self.stdout.write(describe(count, dry_run))
            return
        kept = policies(alias)
        if not kept:
            raise CommandError("no task backend keeps its results for a limited time here: give --older-than")
        rules = [narrowed for rule in kept if (narrowed := rule.within(queues)) is not None]
        total = sum(
            prune(alias, rule.retention, queues=rule.queues, exclude=rule.exclude, dry_run=dry_run)
            for rule in rules
        )
        self.stdout.write(describe(total, dry_run, " past their backend's RESULTS_RETENTION"))
