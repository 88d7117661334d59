"""Moving jobs that wait in time: an operator's "run now" and "reschedule" (the admin's jobs
list). Only a job that waits (pending, waiting for its concurrency key, blocked) moves: the
status is part of each UPDATE's condition, so a job a worker claims meanwhile is left to its
worker, and a job that ended stays ended (tests/test_outcomes.py::test_run_now_and_reschedule)."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice

from ..database.connections import queue_alias
from ..database.validation import INT64_MAX, integer
from ..models import Job, Status

#: The statuses of a job that may move: it waits, nobody runs it.
MOVABLE = (Status.PENDING, Status.WAITING, Status.BLOCKED)
#: Ids in one UPDATE.
CHUNK = 500


def move(job_ids: Iterable[str], when: int, *, using: str | None = None) -> int:
    """Make the jobs among ``job_ids`` that wait due at ``when`` (unix seconds: now, to run them
    now; later or earlier, to reschedule them); returns how many moved."""
    when = integer("due time", when, 0, INT64_MAX)
    alias = queue_alias(using)
    ids = iter(job_ids)
    moved = 0
    while part := list(islice(ids, CHUNK)):
        moved += Job.objects.using(alias).filter(pk__in=part, status__in=MOVABLE).update(next_run_at=when)
    return moved
