"""The dead-letter list: failed jobs, newest last attempt first, with retry and delete actions
(admin/dead_actions.py) and a Retry button on each job's page."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.utils.translation import gettext as _

from ..api.dead_letters import after_delete, delete_where
from ..database.connections import queue_alias
from ..models import FailedJob, Job, Status
from .common import links, refuse_nul
from .dead_actions import DeadLetterActions
from .dead_reports import LOG_EACH
from .jobs import JobDisplay, JobTypeFilter, QueueFilter
from .paginators import TimedCountPaginator

__all__ = ["LOG_EACH", "FailedJobAdmin"]


@admin.register(FailedJob)
class FailedJobAdmin(DeadLetterActions, JobDisplay):
    list_display = ("id", "job_type", "queue", "failed", "error", "runs")
    list_filter = (QueueFilter, JobTypeFilter)
    # By error text too: a filtered list's "select all" retries or deletes every job it shows.
    search_fields = ("id", "job_type", "unique_key", "last_error")
    # Newest last attempt first: the due index's order (status, next_run_at, priority) walked
    # backwards within status = 'failed', so that a page of 100,000 dead jobs reads a page's
    # worth instead of sorting them all by failed_at, which no index holds (an index of its own
    # would cost every enqueue and deletion). A job fails at the end of its last attempt, so the
    # order is that of failed_at but for how long each attempt waited and ran, and rows a seed
    # writer failed (no failed_at) sort among the others
    # (tests/test_admin_input.py::test_the_dead_letter_list_walks_the_due_index).
    ordering = ("-next_run_at", "-priority", "-id")
    paginator = TimedCountPaginator
    actions = ("retry_selected", "restart_selected", "delete_selected")
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
        """The detail page's Retry button, and its "Retry with this payload" form (``payload``):
        a POST with CSRF, like the actions."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.may_retry(request):
            raise PermissionDenied
        job_id = unquote(object_id)  # the URL holds the admin-quoted id, as Django's own views get it
        refuse_nul(request, job_id)
        payload = request.POST.get("payload")
        if payload is None:
            self.retry_jobs(request, [job_id])
        else:
            self.retry_with_payload(request, job_id, payload.replace("\r\n", "\n"))
        return HttpResponseRedirect(
            reverse("admin:django_rws_jobs_failedjob_changelist", current_app=self.admin_site.name)
        )

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        # The single-job delete page: like the action, only while the job is still dead.
        deleted = delete_where(Job.objects.using(queue_alias()).filter(pk=obj.pk, status=Status.FAILED))
        if deleted:
            after_delete(queue_alias(), [obj.pk])
        request._rws_deleted = deleted

    def response_delete(self, request: HttpRequest, obj_display: str, obj_id: Any) -> HttpResponse:
        if getattr(request, "_rws_deleted", 1):
            return super().response_delete(request, obj_display, obj_id)
        self.report_gone(request, [str(obj_id)])
        return HttpResponseRedirect(
            reverse("admin:django_rws_jobs_failedjob_changelist", current_app=self.admin_site.name)
        )
