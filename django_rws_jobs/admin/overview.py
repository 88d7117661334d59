"""The queue overview page: per queue, how much work waits, runs and died, with a bar chart."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Min, Q
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.translation import gettext as _

from .. import humanize
from ..db import queue_alias
from ..models import Job, Status
from .common import links, now

#: The bar segments, in drawing order: (attribute, label, CSS class).
SEGMENTS = (
    ("later", "pending, due later", "later"),
    ("due", "due now", "due"),
    ("running", "running", "running"),
    ("failed", "failed", "failed"),
)


@dataclass
class QueueStats:
    queue: str
    pending: int = 0
    due: int = 0
    running: int = 0
    lease_expired: int = 0
    failed: int = 0
    oldest_due: int | None = None  # next_run_at of the longest-waiting due job

    @property
    def later(self) -> int:
        return self.pending - self.due

    @property
    def total(self) -> int:
        return self.pending + self.running + self.failed

    def waited(self, at: int) -> int | None:
        return None if self.oldest_due is None else max(at - self.oldest_due, 0)


def queue_stats(at: int, using: str | None = None) -> list[QueueStats]:
    """One row per queue that has jobs, in name order.

    Two queries: per status and queue, the count, the due count and the oldest due time, from
    the queue index alone (status, queue and next_run_at are in it: a covering scan, in index
    order, of a million rows reads no table row); and the expired leases, from the running
    range of the due index (tests/test_admin_input.py::test_the_overview_reads_the_queue_index_only).
    """
    alias = queue_alias(using)
    due = Q(next_run_at__lte=at)
    groups = (
        Job.objects.using(alias)
        .values("status", "queue")
        .annotate(n=Count("*"), due=Count("pk", filter=due), oldest_due=Min("next_run_at", filter=due))
        .order_by("status", "queue")
    )
    stats: dict[str, QueueStats] = {}
    for row in groups:
        s = stats.setdefault(row["queue"], QueueStats(row["queue"]))
        if row["status"] == Status.PENDING:
            s.pending, s.due, s.oldest_due = row["n"], row["due"], row["oldest_due"]
        elif row["status"] == Status.RUNNING:
            s.running = row["n"]
        elif row["status"] == Status.FAILED:
            s.failed = row["n"]
    expired = Job.objects.using(alias).lease_expired(at).values("queue").annotate(n=Count("*")).order_by()
    for row in expired:
        stats[row["queue"]].lease_expired = row["n"]
    return [stats[q] for q in sorted(stats)]


def _bars(stats: list[QueueStats]) -> list[dict[str, Any]]:
    """Segment widths in percent of the largest queue, so queues compare at a glance."""
    widest = max((s.total for s in stats), default=0) or 1
    out = []
    for s in stats:
        segments = []
        for attr, label, css in SEGMENTS:
            count = getattr(s, attr)
            if count:
                # At least a sliver, so one failed job among a million pending ones is still seen.
                segments.append({"css": css, "label": label, "count": count,
                                 "width": f"{max(count * 100 / widest, 0.5):.2f}"})
        out.append({"queue": s.queue, "segments": segments})
    return out


def render(request: HttpRequest, model_admin: admin.ModelAdmin) -> TemplateResponse:
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    at = now()
    stats = queue_stats(at)
    context: dict[str, Any] = {**links(request, model_admin)}
    jobs_url, dead_url = context["jobs_url"], context["dead_letter_url"]

    def link(base: str | None, **params: str) -> str | None:
        return f"{base}?{urlencode(params)}" if base else None

    rows = []
    for s in stats:
        waited = s.waited(at)
        rows.append({
            "stats": s,
            "waited": humanize.duration(waited) if waited is not None else None,
            "waited_exact": humanize.absolute(s.oldest_due) if s.oldest_due is not None else "",
            "pending_url": link(jobs_url, queue=s.queue, status__exact=Status.PENDING),
            "due_url": link(jobs_url, queue=s.queue, due="now"),
            "running_url": link(jobs_url, queue=s.queue, status__exact=Status.RUNNING),
            "stuck_url": link(jobs_url, queue=s.queue, due="lease_expired"),
            "failed_url": link(dead_url, queue=s.queue),
        })
    totals = QueueStats("", *(sum(getattr(s, f) for s in stats)
                              for f in ("pending", "due", "running", "lease_expired", "failed")))
    context.update({
        **model_admin.admin_site.each_context(request),
        "title": _("Queue overview"),
        "subtitle": None,
        "opts": model_admin.opts,
        "rows": rows,
        "totals": totals,
        "bars": _bars(stats),
        "legend": [{"css": css, "label": label} for _attr, label, css in SEGMENTS],
        "as_of": humanize.absolute(at),
    })
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "django_rws_jobs/admin/overview.html", context)
