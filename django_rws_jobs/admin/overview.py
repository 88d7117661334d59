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
    """One row per queue that has jobs, in name order, counted in one query."""
    pending = Q(status=Status.PENDING)
    due = pending & Q(next_run_at__lte=at)
    running = Q(status=Status.RUNNING)
    lease_expired = running & (Q(locked_until__lt=at) | Q(locked_until__isnull=True))
    rows = (
        Job.objects.using(queue_alias(using))
        .values("queue")
        .annotate(
            pending=Count("pk", filter=pending),
            due=Count("pk", filter=due),
            running=Count("pk", filter=running),
            lease_expired=Count("pk", filter=lease_expired),
            failed=Count("pk", filter=Q(status=Status.FAILED)),
            oldest_due=Min("next_run_at", filter=due),
        )
        .order_by("queue")
    )
    return [QueueStats(**row) for row in rows]


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
