"""Workers: each rws_worker process's row (rws_workers), alive or dead, with the jobs it holds."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..models import Worker
from ..operations import humanize
from ..operations.worker_rows import DEAD_AFTER
from .common import QueueDatabaseAdmin, ReadOnlyAdminMixin, links, now, time_cell


@admin.register(Worker)
class WorkerAdmin(ReadOnlyAdminMixin, QueueDatabaseAdmin):
    """View only: workers write their own rows (operations/worker_rows.py)."""

    list_display = (
        "id",
        "host",
        "pid",
        "state",
        "heartbeat",
        "queue_list",
        "capacity",
        "holds",
        "done",
        "failed",
        "claims_p99",
    )
    list_filter = ("host",)
    search_fields = ("id", "host")
    ordering = ("host", "started_at", "id")
    actions = None
    change_list_template = "django_rws_jobs/admin/worker_change_list.html"
    fields = (
        "id",
        "host",
        "pid",
        "state",
        "queue_list",
        "capacity",
        "version",
        "started",
        "heartbeat",
        "holds",
        "done",
        "failed",
        "claims_p99",
    )
    readonly_fields = fields

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        context = {**links(request, self), "title": _("Workers"), "dead_after": DEAD_AFTER}
        return super().changelist_view(request, {**context, **(extra_context or {})})

    @admin.display(description=_("state"))
    def state(self, obj: Worker) -> SafeString | str:
        if obj.alive(now()):
            return _("alive")
        return format_html('<strong class="rws-bad">{}</strong>', _("dead"))

    @admin.display(description=_("heartbeat"), ordering="heartbeat_at")
    def heartbeat(self, obj: Worker) -> SafeString | str:
        age = max(now() - obj.heartbeat_at, 0)
        return format_html(
            '<span title="{}">{}</span>',
            humanize.absolute(obj.heartbeat_at),
            _("%(age)s ago (every %(every)s)")
            % {"age": humanize.duration(age), "every": humanize.duration(obj.heartbeat_interval)},
        )

    @admin.display(description=_("started"), ordering="started_at")
    def started(self, obj: Worker) -> SafeString | str:
        return time_cell(obj.started_at)

    @admin.display(description=_("queues"))
    def queue_list(self, obj: Worker) -> str:
        return obj.queues.replace(",", ", ") if obj.queues else str(_("(all)"))

    @admin.display(description=_("pool"))
    def capacity(self, obj: Worker) -> str:
        return f"{obj.executors} {obj.pool}"

    @admin.display(description=_("claims' p99"), ordering="claim_p99")
    def claims_p99(self, obj: Worker) -> str:
        """Its claims' 99th percentile between its last two heartbeats, in milliseconds: what
        rws_health --max-claim-p99 and the alert RwsJobsSlowClaims watch."""
        if obj.claim_p99 is None:
            return "-"
        return f"{obj.claim_p99 * 1000:.1f} ms"

    @admin.display(description=_("holds"))
    def holds(self, obj: Worker) -> SafeString | str:
        """The jobs it held at its last heartbeat, each linked to its page."""
        ids = obj.running_ids()
        if not ids:
            return "-"
        site = self.admin_site.name
        return format_html_join(
            ", ",
            '<a href="{}">{}</a>',
            (
                (reverse("admin:django_rws_jobs_job_change", args=[quote(i)], current_app=site), i)
                for i in ids
            ),
        )
