"""The dead-letter list's actions: retry and delete the selected jobs.

Actions touch only rows still on the list, check the user's permissions on the ``FailedJob`` proxy
(``change_failedjob`` to retry, ``delete_failedjob`` to delete) and say what they did and skipped.
"""

from __future__ import annotations

import re
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.models import CHANGE, DELETION
from django.core.exceptions import BadRequest, PermissionDenied
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from ..api import dead_letters
from ..api import enqueue as api
from ..database.connections import queue_alias
from ..models import FailedJob, Job, Status
from .common import links, now
from .dead_reports import LOG_EACH, DeadLetterReports, batches, ids_text

#: Jobs listed by name on the delete confirmation page; the rest are counted.
MAX_LISTED = 100


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
            # Confirming "all N": leave alone what failed after the confirmation page was shown,
            # and in its second (failed_at is whole seconds); rust-web-server's dead rows have no
            # failed_at and are all taken (tests/test_admin.py
            # test_delete_all_across_pages_confirms_without_listing_every_id).
            queryset = queryset.filter(Q(failed_at__lt=seen) | Q(failed_at__isnull=True))
        return list(queryset.order_by().values_list("pk", flat=True)), []
    chosen = list(dict.fromkeys(request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)))
    have = set(queryset.order_by().values_list("pk", flat=True))  # Django filtered it to the chosen
    return [pk for pk in chosen if pk in have], [pk for pk in chosen if pk not in have]


class DeadLetterActions(DeadLetterReports):
    """FailedJobAdmin's retry and delete actions."""

    def may_retry(self, request: HttpRequest) -> bool:
        """The list's "change" permission, which retry asks for (a job's own page is view-only)."""
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

    @admin.action(
        permissions=["change"], description=gettext_lazy("Retry selected dead jobs from the beginning")
    )
    def restart_selected(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        """Retry the selected jobs with their checkpoints cleared: a long job starts over instead
        of resuming (tests/test_long_jobs.py::test_the_admin_retries_a_dead_long_job_from_the_beginning)."""
        if not self.may_retry(request):
            raise PermissionDenied
        present, gone = _selection(request, queryset)
        self.retry_jobs(request, present, restart=True)
        self.report_gone(request, gone)

    def retry_jobs(self, request: HttpRequest, ids: list[str], restart: bool = False) -> None:
        """Retry the jobs with dead_letters.retry_many (a few statements per batch of ids, whatever their
        number), from the beginning with ``restart``, and report what changed and what was skipped,
        and why."""
        alias = queue_alias()
        retried: list[str] = []
        blocked: list[str] = []
        # Each batch commits on its own: what the batches before a failure did is logged and
        # reported, then the failure is raised
        # (tests/test_admin_input.py::test_an_action_that_fails_half_way_logs_what_it_did).
        with self.done_before_failure(request, CHANGE, retried):
            for done_now, held in dead_letters.retry_batches(ids, using=alias, restart=restart):
                retried += done_now
                blocked += held
        done = set(retried + blocked)
        vanished = [job_id for job_id in ids if job_id not in done]
        self.log_jobs(request, CHANGE, retried)
        if retried and restart:
            self.message_user(
                request,
                ngettext(
                    "Retried %(count)d dead job from the beginning, its checkpoint cleared; it is due now.",
                    "Retried %(count)d dead jobs from the beginning, their checkpoints cleared; "
                    "they are due now.",
                    len(retried),
                )
                % {"count": len(retried)},
                messages.SUCCESS,
            )
        elif retried:
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
                % {"count": len(blocked), "ids": ids_text(blocked)},
                messages.WARNING,
            )
        self.report_gone(request, vanished)

    def retry_with_payload(self, request: HttpRequest, job_id: str, payload: str) -> None:
        """Retry one dead job with the payload the operator edited (its page's form), in one
        transaction: the new payload only if it goes back in the queue."""
        retried = dead_letters.retry(job_id, using=queue_alias(), payload=payload)
        if retried:
            self.log_jobs(request, CHANGE, [job_id])
            self.message_user(
                request, _("Retried 1 dead job with the edited payload; it is due now."), messages.SUCCESS
            )
            return
        self.message_user(
            request,
            _(
                "Job %(id)s was not retried and its payload is unchanged: it has left the "
                "dead-letter list, or a pending or running job of its type holds its unique key."
            )
            % {"id": job_id},
            messages.WARNING,
        )

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
        with self.done_before_failure(request, DELETION, deleted, job_types):
            for batch in batches(ids):
                present = dict(Job.objects.using(alias).filter(pk__in=batch).values_list("pk", "job_type"))
                # status=failed: a job retried since the page was shown is pending now and stays.
                failed = Job.objects.using(alias).filter(pk__in=present, status=Status.FAILED)
                dead_letters.delete_where(failed)
                remaining = set(Job.objects.using(alias).filter(pk__in=present).values_list("pk", flat=True))
                gone = [pk for pk in batch if pk in present and pk not in remaining]
                dead_letters.after_delete(alias, gone)
                deleted += gone
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
