"""``chain()``: jobs that run one step after another, built on ``enqueue(after=)``.

Each step is a ``call(...)`` or a list of them (a group, whose jobs run side by side); every job
of a step waits for every job of the step before it. All of them are enqueued in one
transaction, so a chain is stored whole or not at all (tests/test_dependencies.py).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from ..database import clock
from ..database.connections import queue_alias
from ..database.validation import show
from ..queue import middleware
from ..workflows import dependencies
from ..workflows.batch_outcomes import ROW_METADATA, fresh_row
from .batches import Call
from .enqueue import insert_prepared, waits_for


def chain(*steps: Any, on_dependency_failure: str = "cancel", using: str | None = None) -> list[str]:
    """Enqueue ``steps`` one after another: ``chain(call("a"), [call("b"), call("c")],
    call("d"))`` runs a, then b and c side by side, then d once both have succeeded. A step
    that dies or is cancelled cancels the rest (``on_dependency_failure="cancel"``, the default;
    "run" and "wait" as ``enqueue`` takes them). Returns the jobs' ids in the order given."""
    if not steps:
        raise ValueError("chain() needs at least one step")
    groups: list[list[Call]] = []
    for number, step in enumerate(steps, 1):
        calls = list(step) if isinstance(step, (list, tuple)) else [step]
        if not calls or not all(isinstance(c, Call) for c in calls):
            raise TypeError(
                f"chain() step {number} must be a call(...) or a non-empty list of them, got {show(step)}"
            )
        groups.append(calls)
    alias = queue_alias(using)
    dependencies.policy(on_dependency_failure)  # checked before anything is stored

    def store(extra: dict[str, Any]) -> list[str]:
        now = int(clock.now(alias))
        job_ids: list[str] = []
        before: list[str] = []
        with transaction.atomic(using=alias):
            for calls in groups:
                step_ids: list[str] = []
                for c in calls:
                    deps = waits_for(before, on_dependency_failure) if before else None
                    row = fresh_row(c.row, now)
                    if extra:
                        row[ROW_METADATA] = middleware.merged(row[ROW_METADATA], extra)
                    step_ids.append(insert_prepared(alias, row, deps))
                job_ids += step_ids
                before = step_ids
        return job_ids

    return middleware.many(alias, store)


__all__ = ["chain"]
