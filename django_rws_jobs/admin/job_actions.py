"""The jobs list's actions that move waiting jobs in time: run now, and reschedule to a time the
operator types (api/due.py). Each needs ``change_job`` and says how many jobs moved and how many
were left (running or ended: a job a worker holds is never moved)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from ..api.due import move
from ..database.connections import queue_alias
from .common import now

#: The permission run now and reschedule need.
CHANGE_PERMISSION = "django_rws_jobs.change_job"
#: Jobs one run of an action moves at most.
MOVE_MAX = 10_000


class JobMoves:
    """JobAdmin's run-now and reschedule actions."""

    def has_move_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm(CHANGE_PERMISSION))

    @admin.action(description=gettext_lazy("Run selected jobs now"), permissions=["move"])
    def run_now_selected(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        """Make the selected jobs that wait (a snoozed or retried one included) due now."""
        self._move(request, queryset, now(), _("due now"))

    @admin.action(description=gettext_lazy("Reschedule selected jobs"), permissions=["move"])
    def reschedule_selected(self, request: HttpRequest, queryset: QuerySet[Any]) -> TemplateResponse | None:
        """Ask for the new due time on a page of its own, then move the selected jobs that wait."""
        typed = request.POST.get("rws_due")
        if typed is None:
            return self._ask_due_time(request, queryset, "")
        when = parse_due_time(typed)
        if when is None:
            messages.error(
                request,
                _("%(value)r is not a date and time (YYYY-MM-DD HH:MM, in %(zone)s); nothing was moved.")
                % {"value": typed[:40], "zone": timezone.get_current_timezone_name()},
            )
            return self._ask_due_time(request, queryset, typed)
        self._move(request, queryset, when, _("due at %(when)s") % {"when": _shown(when)})
        return None

    def _move(self, request: HttpRequest, queryset: QuerySet[Any], when: int, what: str) -> None:
        ids = list(queryset.order_by().values_list("pk", flat=True)[: MOVE_MAX + 1])
        moved = move(ids[:MOVE_MAX], when, using=queue_alias())
        left = min(len(ids), MOVE_MAX) - moved
        self.message_user(  # type: ignore[attr-defined]
            request,
            ngettext("%(n)d job is %(what)s.", "%(n)d jobs are %(what)s.", moved)
            % {"n": moved, "what": what},
            messages.SUCCESS if moved else messages.WARNING,
        )
        if left:
            self.message_user(  # type: ignore[attr-defined]
                request,
                ngettext(
                    "%(n)d job was left as it is: it is running or has ended.",
                    "%(n)d jobs were left as they are: they are running or have ended.",
                    left,
                )
                % {"n": left},
                messages.WARNING,
            )
        if len(ids) > MOVE_MAX:
            self.message_user(  # type: ignore[attr-defined]
                request,
                _("Only the first %(n)d were moved; run it again.") % {"n": MOVE_MAX},
                messages.WARNING,
            )

    def _ask_due_time(self, request: HttpRequest, queryset: QuerySet[Any], typed: str) -> TemplateResponse:
        select_across = request.POST.get("select_across") == "1"
        ids = [] if select_across else list(queryset.order_by().values_list("pk", flat=True)[:MOVE_MAX])
        opts = self.opts  # type: ignore[attr-defined]
        context = {
            **self.admin_site.each_context(request),  # type: ignore[attr-defined]
            "title": _("Reschedule jobs"),
            "subtitle": None,
            "opts": opts,
            "count": queryset.count() if select_across else len(ids),
            "ids": ids,
            "select_across": select_across,
            "typed": typed or timezone.localtime().strftime("%Y-%m-%dT%H:%M"),
            "zone": timezone.get_current_timezone_name(),
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        }
        request.current_app = self.admin_site.name  # type: ignore[attr-defined]
        return TemplateResponse(request, "django_rws_jobs/admin/reschedule_jobs.html", context)


def parse_due_time(typed: str) -> int | None:
    """What the reschedule form's field holds (``YYYY-MM-DDTHH:MM``, or with seconds or a space,
    in the current time zone unless it names one) as unix seconds; None when it is no such time
    (tests/test_outcomes.py::test_run_now_and_reschedule)."""
    try:
        when = dt.datetime.fromisoformat(typed.strip())
    except ValueError:
        return None
    if timezone.is_naive(when):
        when = timezone.make_aware(when, timezone.get_current_timezone())
    seconds = int(when.timestamp())
    return seconds if seconds >= 0 else None  # before 1970: no due time a row holds


def _shown(when: int) -> str:
    local = timezone.localtime(dt.datetime.fromtimestamp(when, dt.timezone.utc))
    return local.strftime("%Y-%m-%d %H:%M:%S %Z")
