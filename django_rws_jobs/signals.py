"""Signals sent by the queue."""

import logging
from typing import Any

from asgiref.sync import async_to_sync
from django.dispatch import Signal

__all__ = ["job_cancelled", "job_dead"]

logger = logging.getLogger("django_rws_jobs")

#: Sent once for each job that moves to the dead-letter list, after the write commits.
#: Keyword argument ``job``: the :class:`~django_rws_jobs.models.Job` as it was stored.
job_dead = Signal()

#: Sent once for each job that becomes cancelled, after the write commits: by ``rws.cancel`` (a
#: pending, waiting or blocked job; the holding worker for a running one), by its batch (a cancel,
#: an exception in its block, ``fail_fast``), or because a job or batch it waits for failed
#: (``on_dependency_failure="cancel"``). Keyword argument ``job``.
job_cancelled = Signal()


def send_cancelled(job: Any) -> None:
    """Send job_cancelled to each receiver in turn; what a receiver raises is logged."""
    sync_receivers, async_receivers = job_cancelled._live_receivers(type(job))
    for receiver in [*sync_receivers, *(async_to_sync(r) for r in async_receivers)]:
        try:
            receiver(signal=job_cancelled, sender=type(job), job=job)
        except BaseException:
            logger.exception("job_cancelled receiver %r raised for job %s", receiver, job.id)
