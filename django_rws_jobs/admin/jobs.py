"""All jobs, read-only: the queue as it is, with the queue overview page beside it."""

from __future__ import annotations

import json
from typing import Any, cast

from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from ..api.cancellation import cancel
from ..conf import jobs_settings
from ..database.connections import queue_alias
from ..models import Dependency, Job, JobQuerySet, Status
from ..operations import humanize
from ..queue.progress import parse_progress
from ..queue.registry import registry, time_limit
from ..workflows.successors import SUCCESSOR_POLICY
from . import overview
from .common import (
    QueueDatabaseAdmin,
    ReadOnlyAdminMixin,
    links,
    now,
    pre,
    refuse_nul,
    short_text,
    time_cell,
)
from .job_actions import JobMoves
from .paginators import CappedCountPaginator
from .tasks import TASK_FIELDS, TaskFields
from .waits import waits_for


class DueFilter(admin.SimpleListFilter):
    """What the status column cannot say alone: whether a pending job is due, a running one stuck."""

    title = _("due")
    parameter_name = "due"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [
            ("now", _("pending, due now")),
            ("later", _("pending, due later")),
            ("lease_expired", _("running, lease expired")),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        t = now()
        queryset = cast(JobQuerySet, queryset)
        if self.value() == "now":
            return queryset.due(t)
        if self.value() == "later":
            return queryset.filter(status=Status.PENDING, next_run_at__gt=t)
        if self.value() == "lease_expired":
            return queryset.lease_expired(t)
        return None


class DeclaredChoicesFilter(admin.SimpleListFilter):
    """A filter whose choices are what the code declares, not a SELECT DISTINCT over the table:
    that read every row of a big table on every page of the list (benchmarks/admin.py;
    tests/test_admin_input.py::test_the_jobs_list_reads_no_more_rows_than_it_shows). Any value
    still filters (the overview links to every queue that has jobs), and is offered while chosen."""

    def declared(self) -> set[str]:
        raise NotImplementedError

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        values = self.declared() | ({self.value()} if self.value() is not None else set())
        return [(v, v) for v in sorted(values)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        return queryset.filter(**{self.parameter_name: self.value()}) if self.value() is not None else None


class QueueFilter(DeclaredChoicesFilter):
    title = _("queue")
    parameter_name = "queue"

    def declared(self) -> set[str]:
        specs = [registry.get(t) for t in registry.job_types()]
        options = [spec.options for spec in specs if spec is not None]
        return {"default"} | {o["queue"] for o in options if isinstance(o.get("queue"), str)}


class BatchIdFilter(DeclaredChoicesFilter):
    """A batch's jobs (its page links here); offered only while chosen."""

    title = _("batch")
    parameter_name = "batch_id"

    def declared(self) -> set[str]:
        return set()


class JobTypeFilter(DeclaredChoicesFilter):
    title = _("job type")
    parameter_name = "job_type"

    def declared(self) -> set[str]:
        return set(registry.job_types())


#: How the job's page names where its time limit comes from (registry.time_limit).
LIMIT_SOURCES = {
    "own": _("this job's own"),
    "type": _("its job type's"),
    "setting": _("RWS_JOBS['TIMEOUT']"),
}


def limit_of(job: Job) -> tuple[float | None, str]:
    """A job's time limit and where it comes from."""
    seconds, source = time_limit(job.timeout, job.job_type, jobs_settings.TIMEOUT)
    return seconds, str(LIMIT_SOURCES[source])


def _time_detail(ts: int | None) -> SafeString | str:
    if ts is None:
        return "-"
    return format_html(
        '{} <span class="quiet">({}; unix {})</span>', humanize.relative(ts, now()), humanize.absolute(ts), ts
    )


class JobDisplay(TaskFields, QueueDatabaseAdmin):
    """Columns and detail fields shared by the jobs list and the dead-letter list (a task row's
    task fields too: admin/tasks.py)."""

    @admin.display(description=_("due"), ordering="next_run_at")
    def due(self, obj: Job) -> SafeString | str:
        return time_cell(obj.next_run_at)

    @admin.display(description=_("created"), ordering="created_at")
    def created(self, obj: Job) -> SafeString | str:
        return time_cell(obj.created_at)

    @admin.display(description=_("failed"), ordering="failed_at")
    def failed(self, obj: Job) -> SafeString | str:
        return time_cell(obj.failed_at)

    @admin.display(description=_("error"), ordering="last_error")
    def error(self, obj: Job) -> SafeString | str:
        return short_text(obj.last_error)

    @admin.display(description=_("failed runs"), ordering="attempts")
    def runs(self, obj: Job) -> str:
        # max_retries counts retries; a job runs at most max_retries + 1 times. Snoozes charge
        # no attempt: shown beside them (tests/test_outcomes.py::test_the_admin_shows_snoozes).
        # Resumptions (a hand-back at a worker's stop) charge none either
        # (tests/test_long_jobs.py::test_the_admin_shows_the_checkpoint_and_resumptions).
        runs = f"{obj.attempts} of {obj.max_retries + 1}"
        if obj.snoozes:
            runs += f", snoozed {obj.snoozes}"
        if obj.resumptions:
            runs += f", resumed {obj.resumptions}"
        return runs

    @admin.display(description=_("due"))
    def due_detail(self, obj: Job) -> SafeString | str:
        return _time_detail(obj.next_run_at)

    @admin.display(description=_("created"))
    def created_detail(self, obj: Job) -> SafeString | str:
        return _time_detail(obj.created_at)

    @admin.display(description=_("last claimed"))
    def started_detail(self, obj: Job) -> SafeString | str:
        return _time_detail(obj.started_at)

    @admin.display(description=_("moved to the dead-letter list"))
    def failed_detail(self, obj: Job) -> SafeString | str:
        return _time_detail(obj.failed_at)

    @admin.display(description=_("lease until"))
    def lease_detail(self, obj: Job) -> SafeString | str:
        return _time_detail(obj.locked_until)

    @admin.display(description=_("time limit"))
    def timeout_detail(self, obj: Job) -> str:
        """The limit the job runs under: its own, else its type's, else RWS_JOBS["TIMEOUT"]."""
        seconds, source = limit_of(obj)
        return "none" if seconds is None else f"{seconds:g} s ({source})"

    @admin.display(description=_("concurrency key"))
    def concurrency_detail(self, obj: Job) -> str:
        """The key, and how many jobs with it may run at once (enqueue(concurrency_key=))."""
        if obj.concurrency_key is None:
            return "-"
        slot = "" if obj.concurrency_slot is None else f", {_('holds slot')} {obj.concurrency_slot}"
        return f"{obj.concurrency_key} ({_('limit')} {obj.concurrency_limit or 1}{slot})"

    @admin.display(description=_("cancelled"))
    def cancel_detail(self, obj: Job) -> SafeString | str:
        """When and by whom a job was cancelled, or its cancel requested while it runs."""
        if obj.cancelled_at is not None:
            return format_html("{} ({})", _time_detail(obj.cancelled_at), obj.cancelled_by or _("by the API"))
        if obj.cancel_requested_at is not None:
            return format_html(
                "{} {} ({})", _("requested"), _time_detail(obj.cancel_requested_at), obj.cancelled_by or "-"
            )
        return "-"

    @admin.display(description=_("batch"))
    def batch_detail(self, obj: Job) -> SafeString | str:
        """The batch it is a member of, or whose callback it is (and for which event)."""
        if obj.batch_id is None:
            return "-"
        url = reverse(
            "admin:django_rws_jobs_batchrecord_change",
            args=[quote(obj.batch_id)],
            current_app=self.admin_site.name,
        )
        role = _("callback on_%(event)s") % {"event": obj.batch_event} if obj.batch_event else _("member")
        return format_html('<a href="{}">{}</a> ({})', url, obj.batch_id, role)

    @admin.display(description=_("waits for"))
    def dependency_detail(self, obj: Job) -> SafeString | str:
        """What a job enqueued with after= waits for, with each one's outcome so far."""
        rows = list(
            Dependency.objects.using(obj._state.db)
            .filter(job_id=obj.id)
            .values_list("depends_on", "on_batch", "policy", "outcome")[:50]
        )
        if not rows:
            return "-"
        items = []
        for dep, on_batch, policy, outcome in rows:
            name = "batchrecord" if on_batch else "job"
            url = reverse(
                f"admin:django_rws_jobs_{name}_change", args=[quote(dep)], current_app=self.admin_site.name
            )
            items.append(
                format_html(
                    '<li>{} <a href="{}">{}</a>: {} (on failure: {})</li>',
                    _("batch") if on_batch else _("job"),
                    url,
                    dep,
                    outcome or _("not ended"),
                    _("run it, as its key's successor") if policy == SUCCESSOR_POLICY else policy,
                )
            )
        return format_html("<ul>{}</ul>", format_html_join("", "{}", ((i,) for i in items)))

    @admin.display(description=_("progress"))
    def progress_bar(self, obj: Job) -> SafeString | str:
        """The handler's last report (current_job().progress): a bar where it gave a total."""
        if obj.progress is None:
            return "-"
        report = parse_progress(obj.progress, obj.progress_at)
        label = f"{report.current:g}" if report.total is None else f"{report.current:g} / {report.total:g}"
        if report.message:
            label += f" {report.message}"
        fraction = report.fraction
        if fraction is None:
            return label
        return format_html(
            '<span style="white-space: nowrap"><progress class="rws-progress" value="{}" max="1000" '
            'title="{}"></progress> {}%</span> {}',
            int(fraction * 1000),
            label,
            int(fraction * 100),
            label,
        )

    @admin.display(description=_("progress"))
    def progress_detail(self, obj: Job) -> SafeString | str:
        bar = self.progress_bar(obj)
        if obj.progress_at is None:
            return bar
        return format_html("{} ({})", bar, _time_detail(int(obj.progress_at)))

    @admin.display(description=_("metadata"))
    def metadata_detail(self, obj: Job) -> SafeString | str:
        if obj.metadata is None:
            return "-"
        return pre(json.dumps(obj.metadata, indent=2, ensure_ascii=False))

    @admin.display(description=_("checkpoint"))
    def checkpoint_detail(self, obj: Job) -> SafeString | str:
        """A long job's saved steps and cursors (running/checkpoints.py), as saved: text that is
        not JSON is shown as it is."""
        if obj.checkpoint is None:
            return "-"
        try:
            return pre(json.dumps(json.loads(obj.checkpoint), indent=2, ensure_ascii=False))
        except ValueError:
            return pre(obj.checkpoint)

    @admin.display(description=_("payload"))
    def payload_detail(self, obj: Job) -> SafeString | str:
        return pre(obj.payload)

    @admin.display(description=_("last error"))
    def error_detail(self, obj: Job) -> SafeString | str:
        return pre(obj.last_error)

    @admin.display(description=_("traceback"))
    def traceback_detail(self, obj: Job) -> SafeString | str:
        return pre(obj.traceback)

    fieldsets = (
        (
            None,
            {
                "fields": (
                    "id",
                    "job_type",
                    "status",
                    "queue",
                    "priority",
                    "unique_key",
                    "concurrency_detail",
                    "batch_detail",
                    "dependency_detail",
                    "cancel_detail",
                    "runs",
                    "progress_detail",
                    "timeout_detail",
                )
            },
        ),
        (_("Metadata"), {"fields": ("metadata_detail",)}),
        (_("Checkpoint"), {"fields": ("checkpoint_detail",), "classes": ("collapse",)}),
        (_("Times"), {"fields": ("due_detail", "created_detail", "started_detail", "failed_detail")}),
        (_("Payload"), {"fields": ("payload_detail",)}),
        (_("Error"), {"fields": ("error_detail", "traceback_detail")}),
        (_("Claim"), {"fields": ("locked_by", "lease_detail"), "classes": ("collapse",)}),
    )
    readonly_fields = (*(f for _title, opts in fieldsets for f in opts["fields"]), *TASK_FIELDS)
    search_fields: tuple[str, ...] = ("id", "job_type", "unique_key")
    # Counting the whole table a second time for "N results (M total)" is slow on big queues.
    show_full_result_count = False
    list_per_page = 50


#: The permission the jobs list's cancel action needs (Job's Meta.permissions).
CANCEL_PERMISSION = "django_rws_jobs.cancel_job"
#: Jobs one run of the cancel action cancels at most.
CANCEL_MAX = 10_000


@admin.register(Job)
class JobAdmin(JobMoves, ReadOnlyAdminMixin, JobDisplay):
    """Every job, view only: jobs change through the queue's API, the worker and the dead-letter list."""

    list_display = ("id", "job_type", "status", "queue", "runs", "progress_bar", "due", "created", "error")
    list_filter = ("status", DueFilter, QueueFilter, JobTypeFilter, BatchIdFilter)
    # Failed, then pending by due time (the oldest due first), then running: the order of the
    # due index (status, next_run_at, priority), so that a page of a million-row list reads a
    # page's worth of rows on each database, filtered or not, instead of sorting them all
    # (tests/test_admin_input.py::test_the_jobs_list_reads_no_more_rows_than_it_shows).
    ordering = ("status", "next_run_at", "priority", "id")
    paginator = CappedCountPaginator
    actions = ["cancel_selected", "run_now_selected", "reschedule_selected"]
    change_list_template = "django_rws_jobs/admin/job_change_list.html"
    change_form_template = "django_rws_jobs/admin/job_change_form.html"

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(CANCEL_PERMISSION)

    @admin.action(description=_("Cancel selected jobs"), permissions=["cancel"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        """Cancel the selected jobs that are pending, waiting or running (a running one's worker
        stops it within about a second); the others are left as they are."""
        live = queryset.filter(status__in=(Status.PENDING, Status.WAITING, Status.RUNNING)).order_by()
        ids = list(live.values_list("pk", flat=True)[: CANCEL_MAX + 1])
        by = f"admin:{request.user.get_username()}"
        done = sum(cancel(job_id, by=by, using=queue_alias()) for job_id in ids[:CANCEL_MAX])
        self.message_user(
            request,
            ngettext("Cancelled %(n)d job.", "Cancelled %(n)d jobs.", done) % {"n": done}
            + (" " + _("Running ones stop within about a second.") if done else ""),
            messages.SUCCESS if done else messages.WARNING,
        )
        if len(ids) > CANCEL_MAX:
            self.message_user(
                request,
                _("Only the first %(n)d were cancelled; run it again.") % {"n": CANCEL_MAX},
                messages.WARNING,
            )

    def get_urls(self) -> list[URLPattern]:
        info = self.opts.app_label, self.opts.model_name
        view = self.admin_site.admin_view(self.overview_view)
        # Before the default URLs, whose "<path:object_id>/" would take "overview/" for a job id.
        pause = self.admin_site.admin_view(self.pause_view)
        return [
            path("overview/", view, name="{}_{}_overview".format(*info)),
            path("overview/pause/", pause, name="{}_{}_overview_pause".format(*info)),
            *super().get_urls(),
        ]

    def overview_view(self, request: HttpRequest) -> TemplateResponse:
        """Per queue: pending, due now, running, failed, and how long the oldest due job has waited."""
        return overview.render(request, self)

    def pause_view(self, request: HttpRequest) -> HttpResponseRedirect:
        """POST: pause or resume a queue (the overview's buttons; permission pause_queue)."""
        return overview.change_pause(request, self)

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        context = {**links(request, self), "title": _("Jobs")}
        return super().changelist_view(request, {**context, **(extra_context or {})})

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> Any:
        context = links(request, self)
        refuse_nul(request, unquote(object_id))
        obj = self.get_object(request, unquote(object_id))  # the URL holds the admin-quoted id
        if obj is not None and obj.status == Status.FAILED and context["dead_letter_url"]:
            context["dead_job_url"] = reverse(
                "admin:django_rws_jobs_failedjob_change",
                args=[quote(obj.pk)],
                current_app=self.admin_site.name,
            )
        if obj is not None:
            context["waits_for"] = waits_for(obj, now(), queue_alias())
        return super().change_view(request, object_id, form_url, {**context, **(extra_context or {})})
