"""The dead-letter list: failed jobs, newest failure first, with retry and delete actions.

Actions touch only rows still on the list, check the user's permissions on the ``FailedJob`` proxy
(``change_failedjob`` to retry, ``delete_failedjob`` to delete) and say what they did and skipped.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.admin.utils import unquote
from django.core.exceptions import BadRequest, PermissionDenied
from django.db.models import F, Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from .. import api
from ..db import queue_alias
from ..models import FailedJob, Job, Status
from .common import links, now, refuse_nul
from .jobs import JobDisplay, JobTypeFilter, QueueFilter

#: Ids named in one message at most; the rest are counted.
MAX_IDS_SHOWN = 10
#: Ids per IN (...) list: SQLite builds may allow as few as 999 parameters.
BATCH = 500
#: Jobs listed by name on the delete confirmation page; the rest are counted.
MAX_LISTED = 100


def _batches(ids: list[str]) -> Iterator[list[str]]:
    for i in range(0, len(ids), BATCH):
        yield ids[i:i + BATCH]


def _ids(ids: list[str]) -> str:
    more = len(ids) - MAX_IDS_SHOWN
    return ", ".join(ids[:MAX_IDS_SHOWN]) + (_(" and %(n)d more") % {"n": more} if more > 0 else "")


def _user_id(request: HttpRequest) -> Any:
    user_id = request.user.pk
    assert user_id is not None, "admin views run for logged-in staff only"
    return user_id


def _seen_until(request: HttpRequest) -> int | None:
    """The confirmation page's time (unix seconds), None when the form has none; a 400 for
    anything else than the digits it sends (tests/test_admin_input.py::test_a_bad_seen_until_is_a_400)."""
    seen = request.POST.get("rws_seen_until", "")
    if not seen:
        return None
    if not re.fullmatch(r"[0-9]{1,19}", seen) or int(seen) > api.INT64_MAX:
        raise BadRequest(f"rws_seen_until {seen[:40]!r} is not a time in unix seconds (0 to {api.INT64_MAX})")
    return int(seen)


def _selection(request: HttpRequest, queryset: QuerySet[Any]) -> tuple[list[str], list[str]]:
    """(selected ids still on the list, selected ids no longer on it)."""
    if request.POST.get("select_across") == "1":
        seen = _seen_until(request)
        if seen is not None:
            # Confirming "all N": leave alone what failed after the confirmation page was shown.
            queryset = queryset.filter(Q(failed_at__lte=seen) | Q(failed_at__isnull=True))
        return list(queryset.order_by().values_list("pk", flat=True)), []
    chosen = list(dict.fromkeys(request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)))
    have = set(queryset.order_by().values_list("pk", flat=True))  # Django filtered it to the chosen
    return [pk for pk in chosen if pk in have], [pk for pk in chosen if pk not in have]


@admin.register(FailedJob)
class FailedJobAdmin(JobDisplay):
    list_display = ("id", "job_type", "queue", "failed", "error", "runs")
    list_filter = (QueueFilter, JobTypeFilter)
    # Rows a seed writer failed carry no failed_at; they sort after the ones we timed.
    ordering = (F("failed_at").desc(nulls_last=True), "-next_run_at", "-id")
    actions = ("retry_selected", "delete_selected")
    change_list_template = "django_rws_jobs/admin/failedjob_change_list.html"
    change_form_template = "django_rws_jobs/admin/failedjob_change_form.html"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Nothing is edited in a form, so the detail page is view-only; on the list, "change"
        # is what the retry action asks for.
        if obj is not None:
            return False
        return super().has_change_permission(request)

    def may_retry(self, request: HttpRequest) -> bool:
        return super().has_change_permission(request)

    # ---- retry -----------------------------------------------------------------------------

    @admin.action(permissions=["change"], description=gettext_lazy("Retry selected dead jobs"))
    def retry_selected(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        """Put the selected jobs back in the queue, due now, attempts reset."""
        if not self.may_retry(request):
            raise PermissionDenied
        present, gone = _selection(request, queryset)
        self.retry_jobs(request, present)
        self.report_gone(request, gone)
        if not present and not gone:
            self.message_user(request, _("No dead job was retried: the list is empty."), messages.WARNING)

    def retry_jobs(self, request: HttpRequest, ids: list[str]) -> None:
        """Retry the jobs with api.retry_many (a few statements per batch of ids, whatever their
        number) and report what changed and what was skipped, and why."""
        alias = queue_alias()
        retried, blocked = api.retry_many(ids, using=alias)
        done = set(retried + blocked)
        vanished = [job_id for job_id in ids if job_id not in done]
        for batch in _batches(retried):
            jobs = list(Job.objects.using(alias).filter(pk__in=batch).only("id", "job_type", "status"))
            LogEntry.objects.log_actions(_user_id(request), jobs, CHANGE,
                                         change_message="Retried from the dead-letter list")
        if retried:
            self.message_user(request, ngettext(
                "Retried %(count)d dead job; it is due now.",
                "Retried %(count)d dead jobs; they are due now.", len(retried),
            ) % {"count": len(retried)}, messages.SUCCESS)
        if blocked:
            self.message_user(request, ngettext(
                "Skipped %(count)d job: a pending or running job of the same type holds its "
                "unique key, so retrying it would run that work twice: %(ids)s.",
                "Skipped %(count)d jobs: a pending or running job of the same type holds each one's "
                "unique key, so retrying them would run that work twice: %(ids)s.", len(blocked),
            ) % {"count": len(blocked), "ids": _ids(blocked)}, messages.WARNING)
        self.report_gone(request, vanished)

    # ---- delete ----------------------------------------------------------------------------

    @admin.action(permissions=["delete"], description=gettext_lazy("Delete selected dead jobs"))
    def delete_selected(self, request: HttpRequest, queryset: QuerySet[Any]) -> TemplateResponse | None:
        """Delete the selected jobs after a confirmation page, like Django's own delete_selected."""
        if not self.has_delete_permission(request):
            raise PermissionDenied
        present, gone = _selection(request, queryset)
        if request.POST.get("post") != "yes":
            if present:
                return self._confirm_delete(request, present, gone)
            self.report_gone(request, gone)
            if not gone:
                self.message_user(request, _("No dead job was deleted: the list is empty."), messages.WARNING)
            return None
        self.delete_jobs(request, present)
        self.report_gone(request, gone)
        return None

    def delete_jobs(self, request: HttpRequest, ids: list[str]) -> None:
        """Delete the jobs that are still dead; report the count and the ones that were not."""
        alias = queue_alias()
        deleted, left = 0, []
        for batch in _batches(ids):
            victims = list(FailedJob.objects.using(alias).filter(pk__in=batch).only("id", "job_type", "status"))
            victim_ids = [v.pk for v in victims]
            # status=failed again: a job retried since the line above is pending now and stays.
            deleted += Job.objects.using(alias).filter(pk__in=victim_ids, status=Status.FAILED).delete()[0]
            remaining = set(Job.objects.using(alias).filter(pk__in=victim_ids).values_list("pk", flat=True))
            done = [v for v in victims if v.pk not in remaining]
            if done:
                LogEntry.objects.log_actions(_user_id(request), done, DELETION)
            left += [pk for pk in batch if pk in remaining or pk not in set(victim_ids)]
        if deleted:
            self.message_user(request, ngettext(
                "Deleted %(count)d dead job.", "Deleted %(count)d dead jobs.", deleted,
            ) % {"count": deleted}, messages.SUCCESS)
        self.report_gone(request, left)

    def _confirm_delete(self, request: HttpRequest, ids: list[str], gone: list[str]) -> TemplateResponse:
        select_across = request.POST.get("select_across") == "1"
        listed = list(FailedJob.objects.using(queue_alias()).filter(pk__in=ids[:MAX_LISTED]).order_by("pk"))
        context = {
            **self.admin_site.each_context(request),
            "title": _("Are you sure?"),
            "subtitle": None,
            "opts": self.opts,
            "jobs": listed,
            "count": len(ids),
            "more": max(len(ids) - len(listed), 0),
            # "All N" goes back as Django's own form sends it (one checkbox, select_across=1), so
            # thousands of ids never meet DATA_UPLOAD_MAX_NUMBER_FIELDS.
            "select_across": select_across,
            "ids": ids[:1] if select_across else ids,
            "seen_until": now(),
            "gone": len(gone),
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "media": self.media,
            **links(request, self),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "django_rws_jobs/admin/delete_dead_confirmation.html", context)

    def report_gone(self, request: HttpRequest, ids: list[str]) -> None:
        """Warn about selected jobs that left the list since the page was shown, grouped by why."""
        if not ids:
            return
        found: dict[str, str] = {}
        for batch in _batches(ids):
            found.update(Job.objects.using(queue_alias()).filter(pk__in=batch).values_list("pk", "status"))
        reasons = {
            Status.PENDING: _("it was retried meanwhile and is pending"),
            Status.RUNNING: _("it was retried meanwhile and is running"),
            None: _("it no longer exists"),
        }
        groups: dict[Any, list[str]] = {}
        for job_id in ids:
            groups.setdefault(found.get(job_id), []).append(job_id)
        for status, group in groups.items():
            self.message_user(request, ngettext(
                "Skipped %(count)d job that left the dead-letter list (%(reason)s): %(ids)s.",
                "Skipped %(count)d jobs that left the dead-letter list (%(reason)s): %(ids)s.", len(group),
            ) % {"count": len(group), "reason": reasons.get(status, status), "ids": _ids(group)},
                messages.WARNING)

    # ---- views -----------------------------------------------------------------------------

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        if request.method == "POST":
            self._refuse_forbidden_action(request)
        context = {**links(request, self), "title": _("Dead-letter list")}
        return super().changelist_view(request, {**context, **(extra_context or {})})

    def _refuse_forbidden_action(self, request: HttpRequest) -> None:
        """Answer an action the user may not run with 403; Django would redisplay the list silently."""
        posted = request.POST.getlist("action")
        try:
            name = posted[int(request.POST.get("index", 0))]
        except (ValueError, IndexError):
            return
        if name in (self.actions or []) and name not in self.get_actions(request):
            raise PermissionDenied

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> Any:
        context = {**links(request, self), "may_retry": self.may_retry(request)}
        return super().change_view(request, object_id, form_url, {**context, **(extra_context or {})})

    def get_urls(self) -> list[URLPattern]:
        info = self.opts.app_label, self.opts.model_name
        retry = self.admin_site.admin_view(self.retry_view)
        return [path("<path:object_id>/retry/", retry, name="{}_{}_retry".format(*info)), *super().get_urls()]

    def retry_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The detail page's Retry button: a POST with CSRF, like the actions."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.may_retry(request):
            raise PermissionDenied
        job_id = unquote(object_id)  # the URL holds the admin-quoted id, as Django's own views get it
        refuse_nul(request, job_id)
        self.retry_jobs(request, [job_id])
        return HttpResponseRedirect(reverse("admin:django_rws_jobs_failedjob_changelist",
                                            current_app=self.admin_site.name))

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        # The single-job delete page: like the action, only while the job is still dead.
        deleted = Job.objects.using(queue_alias()).filter(pk=obj.pk, status=Status.FAILED).delete()[0]
        request._rws_deleted = deleted  # type: ignore[attr-defined]

    def response_delete(self, request: HttpRequest, obj_display: str, obj_id: Any) -> HttpResponse:
        if getattr(request, "_rws_deleted", 1):
            return super().response_delete(request, obj_display, obj_id)
        self.report_gone(request, [str(obj_id)])
        return HttpResponseRedirect(reverse("admin:django_rws_jobs_failedjob_changelist",
                                            current_app=self.admin_site.name))
