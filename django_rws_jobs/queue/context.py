"""What a running job knows about itself: ``current_job()``.

The runner sets a context variable to the job while its handler runs (``runner.execute``: the
thread pool, the process pool's child, ``tick()``, and ``django.tasks`` tasks, whose rows the
runner runs too); ``async def`` handlers see it because ``async_to_sync`` runs them in a copy of
the calling context. Outside a handler it is None. Invariant: a handler sees its own job, never
another's, whichever thread or process runs it (tests/test_current_job.py).
"""

from __future__ import annotations

import dataclasses
import json
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..database.backends.claimed import Claimed
    from .batches import Batch

#: The job whose handler runs in this context (the claim as the worker holds it).
running: ContextVar[Claimed | None] = ContextVar("rws_running_job", default=None)
#: The queue's database where jobs run (set once per executor thread, child process and tick());
#: unset, RWS_JOBS["DATABASE"].
serving: ContextVar[str | None] = ContextVar("rws_serving_alias", default=None)


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
    #: The claim the handler runs under (its token fences what the handler writes).
    _claim: Claimed | None = dataclasses.field(default=None, repr=False, compare=False)
    #: The job's (batch_id, batch_event), read from its row the first time one is asked.
    _batch_row: list[tuple[str | None, str | None]] = dataclasses.field(
        default_factory=list, repr=False, compare=False
    )

    @property
    def batch_id(self) -> str | None:
        """The id of the batch this job is a member of, or whose callback it is; else None
        (read from the job's row when asked: the claim does not carry it)."""
        return self._batch()[0]

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
        return self._batch()[1]

    def _batch(self) -> tuple[str | None, str | None]:
        if not self._batch_row:
            from ..models import Job

            row = (
                Job.objects.using(_alias()).filter(id=self.id).values_list("batch_id", "batch_event").first()
            )
            self._batch_row.append((None, None) if row is None else (row[0], row[1]))
        return self._batch_row[0]

    def record(self, value: Any) -> bool:
        """Keep ``value`` (JSON, at most OUTPUT_MAX_BYTES of it) as this batch member's output,
        which ``Batch.outputs()`` reads; a later call, or a later attempt's, replaces it. Written
        through the handler's connection, so inside its ``transaction.atomic()`` it commits or
        rolls back with the handler's work. Returns False, keeping nothing, for a job that is not
        a batch member (a callback is not one) or whose claim this attempt no longer holds
        (tests/test_batches.py::test_record_keeps_a_members_last_output)."""
        text = output_text(value)
        from .outputs import keep

        if self._claim is None:
            return False
        return keep(_alias(), self._claim, text)


def output_text(value: Any) -> str:
    """``value`` as the JSON text ``record`` keeps, within OUTPUT_MAX_BYTES."""
    from ..conf import jobs_settings
    from ..database.validation import show
    from ..database.validation import text as _text

    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"record() takes a JSON value, got {show(value)}: {exc}") from None
    size, limit = len(text.encode("utf-8", "surrogatepass")), int(jobs_settings.OUTPUT_MAX_BYTES)
    if size > limit:
        raise ValueError(
            f"record(): the value is {size} bytes of JSON; the limit is {limit} (OUTPUT_MAX_BYTES)"
        )
    return _text("record()'s value", text)


def _alias() -> Any:
    alias = serving.get()
    if alias is not None:
        return alias
    from ..database.connections import queue_alias

    return queue_alias(None)


def current_job() -> JobContext | None:
    """The job whose handler is running in this thread or task, or None outside a handler."""
    job = running.get()
    if job is None:
        return None
    return JobContext(id=job.id, job_type=job.job_type, queue=job.queue, attempt=job.attempts + 1, _claim=job)
