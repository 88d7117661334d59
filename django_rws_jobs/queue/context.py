"""What a running job knows about itself: ``current_job()``.

The runner sets a context variable to the job while its handler runs (``runner.execute``: the
thread pool, the process pool's child, ``tick()``, and ``django.tasks`` tasks, whose rows the
runner runs too); ``async def`` handlers see it because ``async_to_sync`` runs them in a copy of
the calling context. Outside a handler it is None. Invariant: a handler sees its own job, never
another's, whichever thread or process runs it (tests/test_current_job.py).
"""

from __future__ import annotations

import dataclasses
from contextvars import ContextVar
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..database.backends.claimed import Claimed

#: The job whose handler runs in this context (the claim as the worker holds it).
running: ContextVar[Claimed | None] = ContextVar("rws_running_job", default=None)


@dataclasses.dataclass(frozen=True)
class JobContext:
    """The running job, as its handler sees it."""

    #: The job's id.
    id: str
    #: Its job type (a ``django.tasks`` task's is ``django.tasks:<module path>``).
    job_type: str
    #: Its queue.
    queue: str
    #: Which run this is: 1 on the first, 2 on the first retry, and so on.
    attempt: int


def current_job() -> JobContext | None:
    """The job whose handler is running in this thread or task, or None outside a handler."""
    job = running.get()
    if job is None:
        return None
    return JobContext(id=job.id, job_type=job.job_type, queue=job.queue, attempt=job.attempts + 1)
