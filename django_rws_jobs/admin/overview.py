"""The queue overview page: per queue, how much work waits, runs and died, with a bar chart."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count, QuerySet
from django.http import HttpRequest, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.translation import gettext as _

from ..database.connections import queue_alias
from ..exceptions import TIMED_OUT
from ..flow.limits import configured
from ..flow.pauses import pause_queue, paused_queues, resume_queue
from ..models import Job, Status
from ..operations import humanize
from .activity import charts
from .common import COUNT_CAP, links, now
from .waits import limits_text

#: The bar segments, in drawing order: (attribute, label, CSS class).
SEGMENTS = (
    ("waiting", "waiting for a concurrency key", "waiting"),
    ("later", "pending, due later", "later"),
    ("due", "due now", "due"),
    ("running", "running", "running"),
    ("failed", "failed", "failed"),
)


#: The counts of a row, as the table shows them.
COUNTS = ("waiting", "pending", "due", "running", "lease_expired", "failed", "timed_out")


@dataclass
class QueueStats:
    queue: str
    waiting: int = 0  # jobs whose concurrency key has no free slot yet (concurrency_keys.py)
    pending: int = 0
    due: int = 0
    running: int = 0
    lease_expired: int = 0
    failed: int = 0
    timed_out: int = 0  # of the failed: those whose last attempt ran past its time limit
    oldest_due: int | None = None  # next_run_at of the longest-waiting due job

    @property
    def later(self) -> int:
        return max(self.pending - self.due, 0)  # both may be capped

    @property
    def total(self) -> int:
        return self.waiting + self.pending + self.running + self.failed

    def waited(self, at: int) -> int | None:
        return None if self.oldest_due is None else max(at - self.oldest_due, 0)


def queue_stats(at: int, using: str | None = None) -> list[QueueStats]:
    """One row per queue that has jobs, in name order; each count stops past COUNT_CAP.

    Every statement is an index probe or a range that LIMIT stops (queue index: status, queue,
    priority, next_run_at), so the page reads a few COUNT_CAP entries per queue and state instead
    of every row's entry, as one GROUP BY over the table did; only the running rows are read for
    their leases (tests/test_admin_input.py::test_the_overview_reads_no_whole_range).
    """
    jobs = Job.objects.using(queue_alias(using))
    stats: dict[str, QueueStats] = {}
    states = (
        (Status.WAITING, "waiting"),
        (Status.PENDING, "pending"),
        (Status.RUNNING, "running"),
        (Status.FAILED, "failed"),
    )
    for status, attr in states:
        in_status = jobs.filter(status=status)
        for queue in _distinct(in_status, "queue"):
            s = stats.setdefault(queue, QueueStats(queue))
            setattr(s, attr, _capped(in_status.filter(queue=queue)))
            if status == Status.PENDING:
                _count_due(s, in_status.filter(queue=queue), at)
            if status == Status.FAILED:
                s.timed_out = _capped(in_status.filter(queue=queue, last_error__startswith=TIMED_OUT))
    expired = jobs.lease_expired(at).values("queue").annotate(n=Count("*")).order_by()
    for row in expired:
        stats[row["queue"]].lease_expired = row["n"]
    return [stats[q] for q in sorted(stats)]


def _capped(queryset: QuerySet[Any], at_most: int | None = None) -> int:
    """The number of rows, or COUNT_CAP + 1 (at_most) if there are more than COUNT_CAP."""
    return queryset.order_by()[: COUNT_CAP + 1 if at_most is None else at_most].count()


def _distinct(queryset: QuerySet[Any], field: str) -> list[Any]:
    """field's values in queryset, in order: one index probe each (a loose index scan), where
    SELECT DISTINCT reads every entry."""
    values: list[Any] = []
    while True:
        rest = queryset.filter(**{f"{field}__gt": values[-1]}) if values else queryset
        value = rest.order_by(field).values_list(field, flat=True).first()
        if value is None:
            return values
        values.append(value)


def _count_due(s: QueueStats, pending: QuerySet[Any], at: int) -> None:
    """Due count and oldest due time of one queue's pending jobs: per priority band, the oldest
    is the band's first entry and the due ones a range of it."""
    due = 0
    for priority in _distinct(pending, "priority"):
        band = pending.filter(priority=priority)
        oldest = band.order_by("next_run_at").values_list("next_run_at", flat=True).first()
        if oldest is not None and oldest <= at:
            s.oldest_due = oldest if s.oldest_due is None else min(s.oldest_due, oldest)
            if due <= COUNT_CAP:  # the bands together stop at the cap too
                due += _capped(band.filter(next_run_at__lte=at), COUNT_CAP + 1 - due)
    s.due = due


def shown(count: int) -> str:
    """A count as the page shows it: past the cap, "10000+"."""
    return f"{COUNT_CAP}+" if count > COUNT_CAP else str(count)


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
                segments.append(
                    {
                        "css": css,
                        "label": label,
                        "count": count,
                        "width": f"{max(count * 100 / widest, 0.5):.2f}",
                    }
                )
        out.append({"queue": s.queue, "segments": segments})
    return out


#: The permission the pause and resume buttons need (models.Queue's Meta.permissions).
PAUSE_PERMISSION = "django_rws_jobs.pause_queue"


def change_pause(request: HttpRequest, model_admin: admin.ModelAdmin) -> HttpResponseRedirect:
    """POST ``queue`` and ``action`` (pause or resume); back to the overview with a message."""
    if request.method != "POST":
        raise PermissionDenied
    if not (model_admin.has_view_permission(request) and request.user.has_perm(PAUSE_PERMISSION)):
        raise PermissionDenied
    action, name = request.POST.get("action"), request.POST.get("queue", "")
    back = HttpResponseRedirect(_url(model_admin, "job_overview"))
    if action not in ("pause", "resume"):
        model_admin.message_user(request, _("Unknown action %(a)r.") % {"a": action}, messages.ERROR)
        return back
    try:
        (pause_queue if action == "pause" else resume_queue)(name, using=queue_alias())
    except (TypeError, ValueError) as exc:
        model_admin.message_user(request, str(exc), messages.ERROR)
        return back
    done = _("Paused queue %(q)s: workers claim none of its jobs until it is resumed; running jobs finish.")
    if action == "resume":
        done = _("Resumed queue %(q)s.")
    model_admin.message_user(request, done % {"q": name}, messages.SUCCESS)
    return back


def _url(model_admin: admin.ModelAdmin, name: str) -> str:
    return reverse(f"admin:django_rws_jobs_{name}", current_app=model_admin.admin_site.name)


def render(request: HttpRequest, model_admin: admin.ModelAdmin) -> TemplateResponse:
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    at = now()
    stats = queue_stats(at)
    paused = set(paused_queues(using=queue_alias()))
    limits = configured()
    # A paused queue without jobs is listed still, so that it can be resumed; a limited one, so
    # that its limits are seen.
    idle = (paused | set(limits)) - {s.queue for s in stats}
    stats = sorted([*stats, *map(QueueStats, idle)], key=lambda s: s.queue)
    context: dict[str, Any] = {**links(request, model_admin)}
    jobs_url, dead_url = context["jobs_url"], context["dead_letter_url"]

    def link(base: str | None, **params: str) -> str | None:
        return f"{base}?{urlencode(params)}" if base else None

    rows = []
    for s in stats:
        waited = s.waited(at)
        rows.append(
            {
                "stats": s,
                "waited": humanize.duration(waited) if waited is not None else None,
                "waited_exact": humanize.absolute(s.oldest_due) if s.oldest_due is not None else "",
                "pending_url": link(jobs_url, queue=s.queue, status__exact=str(Status.PENDING)),
                "due_url": link(jobs_url, queue=s.queue, due="now"),
                "running_url": link(jobs_url, queue=s.queue, status__exact=str(Status.RUNNING)),
                "stuck_url": link(jobs_url, queue=s.queue, due="lease_expired"),
                "failed_url": link(dead_url, queue=s.queue),
                "shown": {f: shown(getattr(s, f)) for f in COUNTS},
                "paused": s.queue in paused,
                "limits": limits_text(limits.get(s.queue)),
                "waiting_url": link(jobs_url, queue=s.queue, status__exact=str(Status.WAITING)),
            }
        )
    totals = {f: sum(getattr(s, f) for s in stats) for f in COUNTS}
    capped = {f for f in COUNTS if any(getattr(s, f) > COUNT_CAP for s in stats)}
    totals_shown = {f: f"{n}+" if f in capped else str(n) for f, n in totals.items()}
    context.update(
        {
            **model_admin.admin_site.each_context(request),
            "title": _("Queue overview"),
            "subtitle": None,
            "opts": model_admin.opts,
            "rows": rows,
            "totals": totals_shown,
            "bars": _bars(stats),
            "legend": [{"css": css, "label": label} for _attr, label, css in SEGMENTS],
            "as_of": humanize.absolute(at),
            "activity": charts(at, queue_alias()),
            "can_pause": request.user.has_perm(PAUSE_PERMISSION),
            "pause_url": _url(model_admin, "job_overview_pause"),
        }
    )
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "django_rws_jobs/admin/overview.html", context)
