"""Cron schedules: each stored row with its expression in words and next due time, beside what is declared."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from ..models import JobSchedule
from ..operations import humanize
from ..schedules import cron
from ..schedules.declared import Schedule, ScheduleError, declared
from .common import QueueDatabaseAdmin, links, now, pre, time_cell


@dataclass
class Declared:
    """What settings and @job say about schedule names, read once per page."""

    valid: dict[str, Schedule]
    errors: dict[str, ScheduleError]

    @classmethod
    def read(cls) -> Declared:
        schedules, errors = declared()
        return cls({s.name: s for s in schedules}, {e.name: e for e in errors})


def _attach(row: JobSchedule, known: Declared) -> JobSchedule:
    # Display methods get the row alone; the declaration rides along on it.
    row.rws_declared = known.valid.get(row.name)
    row.rws_error = known.errors.get(row.name)
    return row


class ScheduleChangeList(ChangeList):
    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        known = Declared.read()
        for row in self.result_list:  # evaluates the page; the template reuses these objects
            _attach(row, known)


@admin.register(JobSchedule)
class JobScheduleAdmin(QueueDatabaseAdmin):
    """View only: schedules are declared in code and settings, and the scheduler keeps the rows."""

    list_display = ("name", "expression", "description", "next_due", "job_type", "state")
    search_fields = ("name",)
    ordering = ("name",)
    actions = None
    change_list_template = "django_rws_jobs/admin/jobschedule_change_list.html"
    fields = (
        "name",
        "expression",
        "description",
        "next_due_detail",
        "stored_cron",
        "job_type",
        "payload",
        "options",
        "state",
    )
    readonly_fields = fields

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return ScheduleChangeList

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Any:
        row = super().get_object(request, object_id, from_field)
        return _attach(row, Declared.read()) if row is not None else None

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # A declared schedule's row would come straight back at the next tick (and might skip a
        # run); a row nothing declares any more is the operator's to clean up.
        if obj is not None and (getattr(obj, "rws_declared", None) or getattr(obj, "rws_error", None)):
            return False
        return super().has_delete_permission(request, obj)

    @admin.display(description=gettext_lazy("expression"))
    def expression(self, row: JobSchedule) -> str:
        schedule = getattr(row, "rws_declared", None)
        return schedule.cron if schedule else (row.cron or "-")

    @admin.display(description=gettext_lazy("in words"))
    def description(self, row: JobSchedule) -> str:
        expr = self.expression(row)
        return humanize.describe_cron(expr) if expr != "-" else "-"

    @admin.display(description=gettext_lazy("next due"), ordering="next_run_at")
    def next_due(self, row: JobSchedule) -> SafeString | str:
        return time_cell(row.next_run_at)

    @admin.display(description=gettext_lazy("next due"))
    def next_due_detail(self, row: JobSchedule) -> SafeString | str:
        ts = row.next_run_at
        return format_html(
            '{} <span class="quiet">({}; unix {})</span>',
            humanize.relative(ts, now()),
            humanize.absolute(ts),
            ts,
        )

    @admin.display(description=gettext_lazy("stored expression"))
    def stored_cron(self, row: JobSchedule) -> str:
        return row.cron or _("none (a row written by rust-web-server; treated as changed)")

    @admin.display(description=gettext_lazy("job type"))
    def job_type(self, row: JobSchedule) -> str:
        schedule = getattr(row, "rws_declared", None)
        return schedule.job_type if schedule else "-"

    @admin.display(description=gettext_lazy("payload"))
    def payload(self, row: JobSchedule) -> SafeString | str:
        schedule = getattr(row, "rws_declared", None)
        return pre(schedule.payload) if schedule else "-"

    @admin.display(description=gettext_lazy("enqueue options"))
    def options(self, row: JobSchedule) -> str:
        schedule = getattr(row, "rws_declared", None)
        if not schedule or not schedule.options:
            return "-"
        return ", ".join(f"{k}={v!r}" for k, v in sorted(schedule.options.items()))

    @admin.display(description=gettext_lazy("state"))
    def state(self, row: JobSchedule) -> SafeString | str:
        schedule, error = getattr(row, "rws_declared", None), getattr(row, "rws_error", None)
        if error is not None:
            return format_html('<span class="rws-bad">{}</span> {}', _("declared, invalid:"), str(error))
        if schedule is None:
            return _("not declared: the scheduler leaves this row alone")
        if row.cron != schedule.cron:
            return _("declared; the changed expression takes effect at the next tick")
        return _("declared")

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        known = Declared.read()
        stored = set(
            self.get_queryset(request)
            .filter(name__in=list(known.valid) + list(known.errors))
            .values_list("name", flat=True)
        )
        at = now()
        unstored = [
            {
                "schedule": s,
                "description": humanize.describe_cron(s.cron),
                "first_due": time_cell(cron.next_after(s.cron, at), at),
            }
            for name, s in sorted(known.valid.items())
            if name not in stored
        ]
        context = {
            **links(request, self),
            "title": _("Schedules"),
            "unstored": unstored,
            "invalid": [e for name, e in sorted(known.errors.items())],
        }
        return super().changelist_view(request, {**context, **(extra_context or {})})
