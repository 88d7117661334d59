"""The dead-letter list: failed jobs, newest last attempt first, with retry and delete actions.

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
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import BadRequest, PermissionDenied
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from .. import api, dead_letters
from ..db import queue_alias
from ..models import FailedJob, Job, Status
from .common import links, now, refuse_nul
from .jobs import JobDisplay, JobTypeFilter, QueueFilter
from .paginators import TimedCountPaginator

#: Ids named in one message at most; the rest are counted.
MAX_IDS_SHOWN = 10
#: Ids per IN (...) list: SQLite builds may allow as few as 999 parameters.
BATCH = 500
#: Jobs listed by name on the delete confirmation page; the rest are counted.
MAX_LISTED = 100
#: Jobs an action logs one by one (each job's history shows it, as Django's own actions log);
#: a bigger selection gets one entry naming the count.
LOG_EACH = 100


def _batches(ids: list[str]) -> Iterator[list[str]]:
    for i in range(0, len(ids), BATCH):
        yield ids[i : i + BATCH]


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
    # Newest last attempt first: the due index's order (status, next_run_at, priority) walked
    # backwards within status = 'failed', so that a page of 100,000 dead jobs reads a page's
    # worth instead of sorting them all by failed_at, which no index holds (an index of its own
    # would cost every enqueue and deletion). A job fails at the end of its last attempt, so the
    # order is that of failed_at but for how long each attempt waited and ran, and rows a seed
    # writer failed (no failed_at) sort among the others
    # (tests/test_admin_input.py::test_the_dead_letter_list_walks_the_due_index).
    ordering = ("-next_run_at", "-priority", "-id")
    paginator = TimedCountPaginator
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
        """Retry the jobs with dead_letters.retry_many (a few statements per batch of ids, whatever their
        number) and report what changed and what was skipped, and why."""
        alias = queue_alias()
        retried, blocked = dead_letters.retry_many(ids, using=alias)
        done = set(retried + blocked)
        vanished = [job_id for job_id in ids if job_id not in done]
        self.log_jobs(request, CHANGE, retried)
        if retried:
            self.message_user(
                request,
                ngettext(
                    "Retried %(count)d dead job; it is due now.",
                    "Retried %(count)d dead jobs; they are due now.",
                    len(retried),
                )
                % {"count": len(retried)},
                messages.SUCCESS,
            )
        if blocked:
            self.message_user(
                request,
                ngettext(
                    "Skipped %(count)d job: a pending or running job of the same type holds its "
                    "unique key, so retrying it would run that work twice: %(ids)s.",
                    "Skipped %(count)d jobs: a pending or running job of the same type holds each one's "
                    "unique key, so retrying them would run that work twice: %(ids)s.",
                    len(blocked),
                )
                % {"count": len(blocked), "ids": _ids(blocked)},
                messages.WARNING,
            )
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
        deleted: list[str] = []
        left: list[str] = []
        job_types: dict[str, str] = {}
        for batch in _batches(ids):
            present = dict(Job.objects.using(alias).filter(pk__in=batch).values_list("pk", "job_type"))
            # status=failed: a job retried since the page was shown is pending now and stays.
            Job.objects.using(alias).filter(pk__in=present, status=Status.FAILED).delete()
            remaining = set(Job.objects.using(alias).filter(pk__in=present).values_list("pk", flat=True))
            deleted += [pk for pk in batch if pk in present and pk not in remaining]
            left += [pk for pk in batch if pk not in present or pk in remaining]
            if len(ids) <= LOG_EACH:
                job_types.update(present)
        self.log_jobs(request, DELETION, deleted, job_types)
        if deleted:
            self.message_user(
                request,
                ngettext(
                    "Deleted %(count)d dead job.",
                    "Deleted %(count)d dead jobs.",
                    len(deleted),
                )
                % {"count": len(deleted)},
                messages.SUCCESS,
            )
        self.report_gone(request, left)

    def log_jobs(
        self,
        request: HttpRequest,
        flag: int,
        ids: list[str],
        job_types: dict[str, str] | None = None,
    ) -> None:
        """The admin log of an action: one entry per job for up to LOG_EACH jobs, as Django's own
        actions write them; past that one entry naming the count, on no object: an entry per job
        was half of a retry-all of 100,000 jobs, and a log of 100,000 lines tells an operator no
        more than "Retried 100000 dead jobs" (tests/test_admin_input.py::test_a_big_action_logs_one_entry).
        job_types: each id's job type (for the entries' text), read from the table when None."""
        retry = flag == CHANGE
        if len(ids) > LOG_EACH:
            LogEntry.objects.create(
                user_id=_user_id(request),
                action_flag=flag,
                object_id=None,
                content_type=ContentType.objects.get_for_model(FailedJob, for_concrete_model=False),
                object_repr=f"{len(ids)} dead jobs",
                change_message=(
                    f"{'Retried' if retry else 'Deleted'} {len(ids)} dead jobs from the dead-letter list"
                ),
            )
        elif ids:
            if job_types is None:
                job_types = dict(
                    Job.objects.using(queue_alias()).filter(pk__in=ids).values_list("pk", "job_type")
                )
            model, status = (Job, Status.PENDING) if retry else (FailedJob, Status.FAILED)
            jobs = [model(id=pk, job_type=job_types.get(pk, ""), status=status) for pk in ids]
            LogEntry.objects.log_actions(
                _user_id(request),
                jobs,
                flag,
                change_message="Retried from the dead-letter list" if retry else "",
            )

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
            self.message_user(
                request,
                ngettext(
                    "Skipped %(count)d job that left the dead-letter list (%(reason)s): %(ids)s.",
                    "Skipped %(count)d jobs that left the dead-letter list (%(reason)s): %(ids)s.",
                    len(group),
                )
                % {"count": len(group), "reason": reasons.get(status, status), "ids": _ids(group)},
                messages.WARNING,
            )

    # ---- views -----------------------------------------------------------------------------

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        if request.method == "POST":
            self._refuse_forbidden_action(request)
        context = {**links(request, self), "title": _("Dead-letter list")}
        response = super().changelist_view(request, {**context, **(extra_context or {})})
        cl = getattr(response, "context_data", {}).get("cl")
        if cl is not None and getattr(cl.paginator, "capped", False):  # not "All 1001 selected"
            response.context_data["selection_note_all"] = _("All dead jobs on the list selected")
        return response

    def _refuse_forbidden_action(self, request: HttpRequest) -> None:
        """Answer an action the user may not run with 403; Django would redisplay the list silently."""
        posted = request.POST.getlist("action")
        try:
            name = posted[int(request.POST.get("index", 0))]
        except (ValueError, IndexError):
            return
        if name in (self.actions or []) and name not in self.get_actions(request):
            raise PermissionDenied

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> Any:
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
        return HttpResponseRedirect(
            reverse("admin:django_rws_jobs_failedjob_changelist", current_app=self.admin_site.name)
        )

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        # The single-job delete page: like the action, only while the job is still dead.
        deleted = Job.objects.using(queue_alias()).filter(pk=obj.pk, status=Status.FAILED).delete()[0]
        request._rws_deleted = deleted

    def response_delete(self, request: HttpRequest, obj_display: str, obj_id: Any) -> HttpResponse:
        if getattr(request, "_rws_deleted", 1):
            return super().response_delete(request, obj_display, obj_id)
        self.report_gone(request, [str(obj_id)])
        return HttpResponseRedirect(
            reverse("admin:django_rws_jobs_failedjob_changelist", current_app=self.admin_site.name)
        )
