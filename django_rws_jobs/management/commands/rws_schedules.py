"""python manage.py rws_schedules: the declared cron schedules, their next due times, and stray rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_rws_jobs.database import clock
from django_rws_jobs.database.connections import queue_alias
from django_rws_jobs.management import setting_default
from django_rws_jobs.models import JobSchedule
from django_rws_jobs.operations import humanize
from django_rws_jobs.schedules.declared import declared


def _when(t: int, now: int) -> str:
    """What the admin shows for a unix second: any BIGINT, even one no calendar holds
    (tests/test_input.py::test_rws_schedules_shows_any_stored_due_time)."""
    return f"{humanize.absolute(t)} ({humanize.relative(t, now)})"


def _table(rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return [
        "  " + "  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1]
        for row in rows
    ]


class Command(BaseCommand):
    help = (
        "List the cron schedules declared in RWS_JOBS['SCHEDULES'] and on @job(schedule=...) with their "
        "next due time (UTC), the rows of rws_job_schedules that no schedule here declares, and errors."
    )
    requires_system_checks: list[str] = []  # it shows schedule errors itself

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--database", default=None, help=f"database alias (default: {setting_default('DATABASE')})"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            alias = queue_alias(options["database"])
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        now = int(clock.now(alias))
        schedules, errors = declared()
        stored = {row.name: row for row in JobSchedule.objects.using(alias).order_by("name")}

        if schedules:
            self.stdout.write("Declared schedules (UTC):")
            table: list[tuple[str, ...]] = [("NAME", "CRON", "JOB TYPE", "NEXT DUE")]
            for s in schedules:
                table.append((s.name, s.cron, s.job_type, self._next_due(s, stored.get(s.name), now)))
            self.stdout.write("\n".join(_table(table)))
        else:
            self.stdout.write("No schedules declared.")

        error_names = {e.name for e in errors}
        declared_names = {s.name for s in schedules} | error_names
        stray = [row for name, row in stored.items() if name not in declared_names]
        if stray:
            self.stdout.write("\nRows no schedule here declares (left alone; delete a row to forget it):")
            strays: list[tuple[str, ...]] = [("NAME", "CRON", "NEXT DUE")]
            for row in stray:
                cron = row.cron if row.cron is not None else "(none stored: a rust-web-server row)"
                strays.append((row.name, cron, _when(row.next_run_at, now)))
            self.stdout.write("\n".join(_table(strays)))

        if errors:
            for error in errors:
                self.stderr.write(f"{error} ({error.check_id})")
            raise CommandError(
                f"{len(errors)} schedule error(s); workers refuse to start until they are fixed"
            )

    def _next_due(self, schedule: Any, row: JobSchedule | None, now: int) -> str:
        if row is None:
            return f"{_when(schedule.next_after(now), now)}, once a worker has seen it"
        if row.next_run_at <= now:
            return f"{_when(row.next_run_at, now)}: due, enqueued at the next tick"
        if row.cron != schedule.cron:
            return (
                f"{_when(schedule.next_after(now), now)} (the row still says "
                f"{_when(row.next_run_at, now)} for {row.cron!r}; the next tick updates it)"
            )
        return _when(row.next_run_at, now)
