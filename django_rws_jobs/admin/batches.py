"""Batches: each batch's state, progress and counts, callbacks and metadata; cancel a batch or
retry its dead members."""

from __future__ import annotations

import itertools
import json
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from ..api.batches import Batch, get_batch
from ..database.connections import queue_alias
from ..models import BatchOutput, BatchRecord
from ..workflows import outputs
from .common import QueueDatabaseAdmin, ReadOnlyAdminMixin, links, pre, time_cell

#: The permission the cancel action needs (Job's Meta.permissions), as on the jobs list.
CANCEL_PERMISSION = "django_rws_jobs.cancel_job"
#: The permission retrying dead members needs: the dead-letter list's retry.
RETRY_PERMISSION = "django_rws_jobs.change_failedjob"
#: Outputs a batch's page shows.
OUTPUTS_SHOWN = 20


def _batch(obj: BatchRecord) -> Batch:
    """The batch with its counts, read once per row and page (kept on the row object)."""
    kept = getattr(obj, "_rws_batch", None)
    if kept is None:
        kept = get_batch(obj.id, using=obj._state.db or queue_alias())
        obj._rws_batch = kept
    assert kept is not None
    return kept


def progress_bar(batch: Batch) -> SafeString:
    """Ended members of all, as a bar and a percentage."""
    ended = batch.total - batch.pending
    percent = 100 if batch.total == 0 else int(100 * ended / batch.total)
    return format_html(
        '<span style="white-space: nowrap"><progress class="rws-progress" value="{}" max="{}" title="{}">'
        "</progress> {}%</span>",
        ended,
        max(batch.total, 1),
        _("%(ended)d of %(total)d ended") % {"ended": ended, "total": batch.total},
        percent,
    )


@admin.register(BatchRecord)
class BatchAdmin(ReadOnlyAdminMixin, QueueDatabaseAdmin):
    """View only, with two actions: batches change through the queue (api/batches.py)."""

    list_display = (
        "id",
        "description",
        "state",
        "outcome",
        "progress",
        "total",
        "succeeded",
        "failed",
        "cancelled",
        "pending",
        "created",
    )
    list_filter = ("state",)
    search_fields = ("id", "description")
    ordering = ("-created_at", "-id")
    show_full_result_count = False
    list_per_page = 50
    actions = ["cancel_selected", "retry_failed_members"]
    change_list_template = "django_rws_jobs/admin/batchrecord_change_list.html"
    fields = (
        "id",
        "description",
        "state",
        "outcome",
        "progress",
        "counts",
        "members",
        "callback_detail",
        "outputs_detail",
        "metadata_detail",
        "fail_fast",
        "generation",
        "created",
        "sealed",
        "finished",
    )
    readonly_fields = fields

    @admin.display(description=_("progress"))
    def progress(self, obj: BatchRecord) -> SafeString:
        return progress_bar(_batch(obj))

    @admin.display(description=_("succeeded"))
    def succeeded(self, obj: BatchRecord) -> int:
        return _batch(obj).succeeded

    @admin.display(description=_("failed"))
    def failed(self, obj: BatchRecord) -> int:
        return _batch(obj).failed

    @admin.display(description=_("cancelled"))
    def cancelled(self, obj: BatchRecord) -> int:
        return _batch(obj).cancelled

    @admin.display(description=_("pending"))
    def pending(self, obj: BatchRecord) -> int:
        return _batch(obj).pending

    @admin.display(description=_("counts"))
    def counts(self, obj: BatchRecord) -> str:
        b = _batch(obj)
        return str(
            _(
                "%(total)d members: %(ok)d succeeded, %(failed)d failed, %(cancelled)d cancelled, "
                "%(pending)d pending"
            )
            % {
                "total": b.total,
                "ok": b.succeeded,
                "failed": b.failed,
                "cancelled": b.cancelled,
                "pending": b.pending,
            }
        )

    @admin.display(description=_("members"))
    def members(self, obj: BatchRecord) -> SafeString:
        """Links to the members that have not succeeded (the rows left), and to the dead ones."""
        jobs = reverse("admin:django_rws_jobs_job_changelist", current_app=self.admin_site.name)
        left = f"{jobs}?{urlencode({'batch_id': obj.id})}"
        dead = f"{jobs}?{urlencode({'batch_id': obj.id, 'status': 'failed'})}"
        return format_html('<a href="{}">{}</a> · <a href="{}">{}</a>', left, _("jobs left"), dead, _("dead"))

    @admin.display(description=_("callbacks"))
    def callback_detail(self, obj: BatchRecord) -> str:
        calls = _batch(obj).callbacks
        return "; ".join(f"on_{event}: {', '.join(types)}" for event, types in sorted(calls.items())) or "-"

    @admin.display(description=_("outputs"))
    def outputs_detail(self, obj: BatchRecord) -> SafeString | str:
        """How many members kept an output (current_job().record), and the first OUTPUTS_SHOWN."""
        alias = queue_alias()
        kept = BatchOutput.objects.using(alias).filter(batch_id=obj.id).count()
        if not kept:
            return "-"
        shown = itertools.islice(outputs.read(alias, obj.id, page=OUTPUTS_SHOWN), OUTPUTS_SHOWN)
        lines = [f"{job_id}: {json.dumps(value, ensure_ascii=False)[:200]}" for job_id, value in shown]
        more = [str(_("... and %(n)d more: Batch.outputs() reads them all") % {"n": kept - len(lines)})]
        return pre("\n".join(lines + (more if kept > len(lines) else [])))

    @admin.display(description=_("metadata"))
    def metadata_detail(self, obj: BatchRecord) -> SafeString | str:
        if not obj.metadata:
            return "-"
        return pre(json.dumps(json.loads(obj.metadata), indent=2, ensure_ascii=False))

    @admin.display(description=_("created"), ordering="created_at")
    def created(self, obj: BatchRecord) -> SafeString | str:
        return time_cell(obj.created_at)

    @admin.display(description=_("sealed"), ordering="sealed_at")
    def sealed(self, obj: BatchRecord) -> SafeString | str:
        return time_cell(obj.sealed_at)

    @admin.display(description=_("finished"), ordering="finished_at")
    def finished(self, obj: BatchRecord) -> SafeString | str:
        return time_cell(obj.finished_at)

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(CANCEL_PERMISSION)

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(RETRY_PERMISSION)

    @admin.action(description=_("Cancel selected batches"), permissions=["cancel"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        """Cancel the selected open or sealed batches: pending members at once, running ones asked."""
        by = f"admin:{request.user.get_username()}"
        done = sum(_batch(obj).cancel(by=by) for obj in queryset.filter(state__in=("open", "sealed"))[:1000])
        self.message_user(
            request,
            ngettext("Cancelled %(n)d batch.", "Cancelled %(n)d batches.", done) % {"n": done},
            messages.SUCCESS if done else messages.WARNING,
        )

    @admin.action(description=_("Retry the dead members of selected batches"), permissions=["retry"])
    def retry_failed_members(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        done = sum(_batch(obj).retry_failed() for obj in queryset[:1000])
        self.message_user(
            request,
            ngettext("Put %(n)d dead member back.", "Put %(n)d dead members back.", done) % {"n": done},
            messages.SUCCESS if done else messages.WARNING,
        )

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        context = {**links(request, self), "title": _("Batches")}
        return super().changelist_view(request, {**context, **(extra_context or {})})
