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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..database.backends.claimed import Claimed
    from .batches import Batch

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

    @property
    def batch_id(self) -> str | None:
        """The id of the batch this job is a member of, or whose callback it is; else None
        (read from the job's row when asked: the claim does not carry it)."""
        return self._batch_row()[0]

    @property
    def batch(self) -> Batch | None:
        """The batch (read now) this job is a member of, or whose callback it is; else None."""
        batch_id = self.batch_id
        if batch_id is None:
            return None
        from .batches import get_batch

        return get_batch(batch_id, using=_alias())

    @property
    def batch_event(self) -> str | None:
        """For a batch's callback, why it runs: "success", "failure" or "finish"; else None."""
        return self._batch_row()[1]

    def _batch_row(self) -> tuple[str | None, str | None]:
        from ..models import Job

        row = Job.objects.using(_alias()).filter(id=self.id).values_list("batch_id", "batch_event").first()
        return (None, None) if row is None else (row[0], row[1])


def _alias() -> Any:
    from ..database.connections import queue_alias

    return queue_alias(None)


def current_job() -> JobContext | None:
    """The job whose handler is running in this thread or task, or None outside a handler."""
    job = running.get()
    if job is None:
        return None
    return JobContext(id=job.id, job_type=job.job_type, queue=job.queue, attempt=job.attempts + 1)
