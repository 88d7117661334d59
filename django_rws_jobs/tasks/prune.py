"""Pruning ``rws_task_results``: by the worker, in batches, after each backend's
``OPTIONS["RESULTS_RETENTION"]``; by ``manage.py rws_prune_task_results`` on demand.

Nothing here imports django.tasks until a backend is configured, so the worker's lease keeper can
call ``prune_expired`` in a project without it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from ..database import clock
from ..models import TaskResultRecord
from .backend import RwsJobsBackend
from .compat import task_backends

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
    exclude: Sequence[str] = (),
    dry_run: bool = False,
    now: float | None = None,
    budget: float | None = None,
) -> int:
    """Delete (or, ``dry_run``, count) the results finished more than ``older_than`` seconds ago,
    in ``queues`` (all when None) but not in ``exclude``, oldest first, BATCH at a time; return
    how many."""
    now = clock.now(alias) if now is None else now
    found = TaskResultRecord.objects.using(alias).filter(finished_at__lt=int(now - older_than))
    if queues is not None:
        found = found.filter(queue__in=list(queues))
    if exclude:
        found = found.exclude(queue__in=list(exclude))
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


@dataclass(frozen=True)
class Rule:
    """Results older than ``retention`` seconds may go: in ``queues``, or, when None, in every
    queue but those in ``exclude``."""

    retention: float
    queues: list[str] | None
    exclude: list[str]

    def within(self, asked: Sequence[str] | None) -> Rule | None:
        """This rule narrowed to the queues ``asked`` (all when None); None when none is left."""
        if asked is None:
            return self
        if self.queues is not None:
            kept = [q for q in self.queues if q in asked]
        else:
            kept = [q for q in asked if q not in self.exclude]
        return Rule(self.retention, kept, []) if kept else None


def policies(alias: str) -> list[Rule]:
    """What may be pruned on ``alias``, from the RwsJobsBackends in TASKS whose database it is.

    A result does not say which backend enqueued its task, only its queue, so every backend that
    takes that queue decides: the result goes once it is older than the longest of their
    retentions, and never while one of them keeps its results (None). A backend with no QUEUES
    takes every queue (tests/test_tasks_extras.py::test_pruning_keeps_what_any_backend_keeps)."""
    if not getattr(settings, "TASKS", None):
        return []

    named: dict[str, list[float | None]] = {}
    anywhere: list[float | None] = []  # the retentions of the backends that take every queue
    for backend in task_backends.all():
        if isinstance(backend, RwsJobsBackend) and backend.database == alias:
            if backend.queues:
                for queue in backend.queues:
                    named.setdefault(queue, []).append(backend.retention)
            else:
                anywhere.append(backend.retention)
    rules: dict[float, list[str]] = {}
    for queue, retentions in sorted(named.items()):
        longest = _longest([*retentions, *anywhere])
        if longest is not None:
            rules.setdefault(longest, []).append(queue)
    found = [Rule(age, queues, []) for age, queues in rules.items()]
    rest = _longest(anywhere) if anywhere else None
    if rest is not None:
        found.append(Rule(rest, None, sorted(named)))
    return found


def _longest(retentions: list[float | None]) -> float | None:
    return None if any(r is None for r in retentions) else max(r for r in retentions if r is not None)


def prune_expired(alias: str, now: float | None = None) -> int:
    """The worker's automatic pruning: each backend's expired results, within BUDGET seconds."""
    try:
        kept = policies(alias)
    except ImportError:  # TASKS names our backend but neither django.tasks nor the backport exists
        return 0
    total = 0
    for rule in kept:
        total += prune(
            alias, rule.retention, queues=rule.queues, exclude=rule.exclude, now=now, budget=BUDGET
        )
    if total:
        logger.info("pruned %d task result(s) past their retention", total)
    return total


def describe(count: int, dry_run: bool, extra: Any = "") -> str:
    verb = "would delete" if dry_run else "deleted"
    return f"{verb} {count} task result(s){extra}"
