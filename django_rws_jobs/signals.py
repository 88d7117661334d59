"""Signals sent by the queue."""

from django.dispatch import Signal

#: Sent once for each job that moves to the dead-letter list, after the write commits.
#: Keyword argument ``job``: the :class:`~django_rws_jobs.models.Job` as it was stored.
job_dead = Signal()

#: Sent once for each job that becomes cancelled (cancellation.cancel on a pending or waiting job,
#: the holding worker for a running one), after the write commits. Keyword argument ``job``.
job_cancelled = Signal()
