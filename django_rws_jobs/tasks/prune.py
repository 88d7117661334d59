"""Pruning ``rws_task_results``: by the worker, in batches, after each backend's
``OPTIONS["RESULTS_RETENTION"]``; by ``manage.py rws_prune_task_results`` on demand.

Nothing here imports django.tasks until a backend is configured, so the worker's lease keeper can
call ``prune_expired`` in a project without it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from django.conf import settings

from ..models import TaskResultRecord

logger = logging.getLogger("django_rws_jobs")

#: Results deleted per statement: short transactions, an index range of finished_at each.
BATCH = 1000
#: Seconds the worker spends pruning at one go; what is left waits for the next round.
BUDGET = 1.0


def prune(
    alias: str,
    older_than: float,
    *,
    queues: Sequence[str] | None = None,
    dry_run: bool = False,
    now: float | None = None,
    budget: float | None = None,
) -> int:
    """Delete (or, ``dry_run``, count) the results finished more than ``older_than`` seconds ago,
    in ``queues`` (all when None), oldest first, BATCH at a time; return how many."""
    now = time.time() if now is None else now
    found = TaskResultRecord.objects.using(alias).filter(finished_at__lt=int(now - older_than))
    if queues:
        found = found.filter(queue__in=list(queues))
    if dry_run:
        return found.count()
    deadline = None if budget is None else time.monotonic() + budget
    total = 0
    while True:
        ids = list(found.order_by("finished_at").values_list("id", flat=True)[:BATCH])
        if ids:
            total += TaskResultRecord.objects.using(alias).filter(id__in=ids).delete()[0]
        if len(ids) < BATCH or (deadline is not None and time.monotonic() > deadline):
            return total


def policies(alias: str) -> list[tuple[float, list[str] | None]]:
    """(retention seconds, queues) of each RwsJobsBackend in TASKS whose database is ``alias``."""
    if not getattr(settings, "TASKS", None):
        return []
    from .backend import RwsJobsBackend
    from .compat import task_backends

    found = []
    for backend in task_backends.all():
        if (
            isinstance(backend, RwsJobsBackend)
            and backend.database == alias
            and backend.retention is not None
        ):
            found.append((backend.retention, sorted(backend.queues) or None))
    return found


def prune_expired(alias: str, now: float | None = None) -> int:
    """The worker's automatic pruning: each backend's expired results, within BUDGET seconds."""
    try:
        kept = policies(alias)
    except ImportError:  # TASKS names our backend but neither django.tasks nor the backport exists
        return 0
    total = 0
    for retention, queues in kept:
        total += prune(alias, retention, queues=queues, now=now, budget=BUDGET)
    if total:
        logger.info("pruned %d task result(s) past their retention", total)
    return total


def describe(count: int, dry_run: bool, extra: Any = "") -> str:
    verb = "would delete" if dry_run else "deleted"
    return f"{verb} {count} task result(s){extra}"
