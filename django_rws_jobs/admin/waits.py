"""Why a due job has not started: its queue paused, its queue at its concurrency or rate limit,
or its concurrency key at its limit. What the job page's "Why it waits" box says
(tests/test_admin.py::test_a_due_jobs_page_says_why_it_waits)."""

from __future__ import annotations

import math

from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from ..flow.limited_claims import next_start
from ..flow.limits import PERIODS, QueueLimits, configured
from ..flow.pauses import paused_queues
from ..models import Job, Status
from ..operations import humanize

#: A rate limit's period as its unit: 1 -> "s" (limits.PERIODS read backwards).
UNITS = {seconds: unit for unit, seconds in PERIODS.items()}
#: A rate limit's period in words, as the job page says it.
PERIOD_WORDS = {1: gettext_lazy("second"), 60: gettext_lazy("minute"), 3600: gettext_lazy("hour")}


def rate_text(limits: QueueLimits) -> str:
    """A rate limit as it was written: "100/m"."""
    return f"{limits.rate}/{UNITS[limits.period]}"


def limits_text(limits: QueueLimits | None) -> str:
    """A queue's limits in a few words, as the overview and ``rws_queues list`` show them."""
    if limits is None:
        return "-"
    parts = []
    if limits.concurrency is not None:
        parts.append(_("%(n)d at once") % {"n": limits.concurrency})
    if limits.rate is not None:
        parts.append(rate_text(limits))
    return ", ".join(parts)


def waits_for(job: Job, at: int, alias: str) -> str | None:
    """Why ``job``, due at ``at``, has not started; None when nothing holds it back (it is not
    due, not waiting or pending, or it starts at the next claim)."""
    if job.next_run_at > at:
        return None
    if job.status == Status.WAITING and job.concurrency_key is not None:
        return _key_waits(job, alias)
    if job.status != Status.PENDING:
        return None
    if job.queue in paused_queues(using=alias):
        return _("Due, and waiting: its queue %(q)s is paused. It starts once the queue is resumed.") % {
            "q": job.queue
        }
    limits = configured().get(job.queue)
    return None if limits is None else _queue_waits(job, limits, at, alias)


def _key_waits(job: Job, alias: str) -> str:
    limit = job.concurrency_limit or 1
    holders = list(
        Job.objects.using(alias)
        .filter(concurrency_key=job.concurrency_key, concurrency_slot__isnull=False)
        .order_by("concurrency_slot")
        .values_list("id", flat=True)[: limit + 1]
    )
    values = {"key": job.concurrency_key, "limit": limit, "taken": len(holders), "ids": ", ".join(holders)}
    if len(holders) >= limit:
        return (
            _(
                "Due, and waiting: its concurrency key %(key)s has all %(limit)d of its slots taken "
                "(by %(ids)s). It becomes pending when one of them ends."
            )
            % values
        )
    return (
        _(
            "Due, and waiting: its concurrency key %(key)s has %(taken)d of %(limit)d slots taken; "
            "a worker makes it pending within about a second."
        )
        % values
    )


def _queue_waits(job: Job, limits: QueueLimits, at: int, alias: str) -> str | None:
    jobs = Job.objects.using(alias)
    values: dict[str, object] = {"q": job.queue}
    if limits.concurrency is not None:
        running = jobs.filter(status=Status.RUNNING, queue=job.queue).count()
        if running >= limits.concurrency:
            values.update(running=running, limit=limits.concurrency)
            return (
                _(
                    "Due, and waiting: its queue %(q)s runs %(running)d jobs, its concurrency limit "
                    "of %(limit)d. It starts when one of them ends."
                )
                % values
            )
    if limits.rate is not None:
        frees = next_start(alias, job.queue, limits, at)
        if frees is not None:
            values.update(
                n=limits.rate,
                period=PERIOD_WORDS[limits.period],
                rate=rate_text(limits),
                next=humanize.absolute(math.ceil(frees)),
            )
            return (
                _(
                    "Due, and waiting: its queue %(q)s started %(n)d jobs in the last %(period)s, its "
                    "rate limit of %(rate)s. It starts from %(next)s."
                )
                % values
            )
    return None
