"""What the queue's admin pages share: the queue's database, readable time cells, short text cells."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.core.exceptions import BadRequest
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import Truncator

from ..database import clock
from ..database.connections import queue_alias
from ..models import BatchRecord, FailedJob, Job, JobSchedule, TaskResultRecord, Worker
from ..operations import humanize

#: Rows a count on a big table reads at most: past it the jobs list says "more than", the
#: overview "10000+".
COUNT_CAP = 10_000


def now() -> int:
    return int(clock.now())


def time_cell(ts: int | None, at: int | None = None) -> SafeString | str:
    """ "in 3 min" / "2 h ago", with the exact UTC time on hover."""
    if ts is None:
        return "-"
    return format_html(
        '<span title="{}">{}</span>', humanize.absolute(ts), humanize.relative(ts, at or now())
    )


def short_text(text: str | None, limit: int = 80) -> SafeString | str:
    """The first line of ``text``, cut at ``limit`` characters, with all of it on hover."""
    if not text:
        return "-"
    first = text.strip().splitlines()[0] if text.strip() else text
    return format_html('<span title="{}">{}</span>', text, Truncator(first).chars(limit))


def pre(text: str | None) -> SafeString | str:
    """Multi-line text (payload, traceback) as written, escaped."""
    if text is None:
        return "-"
    if text == "":
        return format_html("<em>{}</em>", "(empty)")
    return format_html('<pre class="rws-pre">{}</pre>', text)


class ReadOnlyAdminMixin:
    """Pages that show the queue but never add, change or delete through the admin's forms."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def refuse_nul(request: HttpRequest, *values: str) -> None:
    """A 400 for a NUL character in a parameter (GET or POST) or in ``values`` (object ids, unquoted).

    No id, queue, job type or schedule name holds one (``enqueue`` refuses it), and PostgreSQL
    answers a NUL in a query with an error, where the other databases find no row: without
    this, the same URL was a 500 on one database and "not found" on the others
    (tests/test_admin_input.py::test_a_nul_anywhere_is_a_400_on_every_database).
    """
    params = [*request.GET.lists(), *request.POST.lists()]
    if any("\x00" in v for v in values) or any(
        "\x00" in key or any("\x00" in v for v in vs) for key, vs in params
    ):
        raise BadRequest("a parameter or id contains a NUL character, which no job or schedule holds")


class QueueDatabaseAdmin(admin.ModelAdmin):
    """Reads and writes through RWS_JOBS['DATABASE'], like the queue itself.

    Without this a project whose queue lives on another alias (and has no router for it) would
    see the default database's empty tables. Every view refuses a NUL in its input (refuse_nul).
    """

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).using(queue_alias())

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        refuse_nul(request)
        return super().changelist_view(request, extra_context)

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> Any:
        refuse_nul(request, unquote(object_id or ""))
        return super().changeform_view(request, object_id, form_url, extra_context)

    def delete_view(
        self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None
    ) -> Any:
        refuse_nul(request, unquote(object_id))
        return super().delete_view(request, object_id, extra_context)

    def history_view(
        self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None
    ) -> Any:
        refuse_nul(request, unquote(object_id))
        return super().history_view(request, object_id, extra_context)


def links(request: HttpRequest, model_admin: admin.ModelAdmin) -> dict[str, str | None]:
    """URLs of the queue's admin pages that this user may see (None for the others).

    Every page of the app shows them all but itself, in this order (_links.html;
    tests/test_admin.py::test_every_page_links_to_every_other_page)."""
    site = model_admin.admin_site

    def url(name: str, model: type[Any]) -> str | None:
        if not site.is_registered(model) or not site.get_model_admin(model).has_view_permission(request):
            return None
        return reverse(f"admin:django_rws_jobs_{name}", current_app=site.name)

    return {
        "overview_url": url("job_overview", Job),
        "jobs_url": url("job_changelist", Job),
        "dead_letter_url": url("failedjob_changelist", FailedJob),
        "schedules_url": url("jobschedule_changelist", JobSchedule),
        "workers_url": url("worker_changelist", Worker),
        "batches_url": url("batchrecord_changelist", BatchRecord),
        "task_results_url": url("taskresultrecord_changelist", TaskResultRecord),
    }
