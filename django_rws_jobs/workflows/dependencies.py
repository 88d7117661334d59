"""Jobs that wait for jobs: ``enqueue(..., after=[ids or batches], on_dependency_failure=)``. This
module adds what a job waits for at its enqueue (``add``); dependency_outcomes.py resolves it
when that ends (``ended``, ``resolve``, ``recheck``, ``sweep``, ``deleted``, ``rewait``,
``prune``). The invariants of both are here.

A job enqueued with ``after`` is stored ``blocked`` (no claim reads it) with a row of
``rws_job_dependencies`` per thing it waits for. When that ends, the row's ``outcome`` is set
(succeeded, failed) and the job is resolved: pending once everything it waits for has succeeded;
on a failure, by the row's policy: ``cancel`` cancels it (and, in turn, what waits on it),
``run`` counts the failure as done, ``wait`` keeps it blocked until the dependency is retried
and succeeds. A job whose row is gone has succeeded, unless an operator deleted it
(``deleted``: a failure that no retry can end, so a ``wait`` is cancelled). An id that names no
job and no batch is taken for a job that succeeded only if this queue made it before the
enqueue, and refused otherwise (``_current_outcomes``).

Invariants (tests/test_dependencies.py):

- Nothing polls. The worker that ends a job with dependents (``has_dependents``, returned by
  the deletion of a finished job) resolves them after its own commit
  (``batch_outcomes.settle``); a batch's finish resolves what waits for the batch.
- An enqueue only reads the rows of what it waits for; it takes no lock on them. After its
  commit, ``recheck`` sets their flag in a short transaction of its own, whatever their status
  (a dead one may be retried and succeed), then looks at them again. An end that crosses the
  enqueue is caught by one of the two: an end written after the flag's commit reads the flag
  (the deletion returns it); one written before it is seen by the look that follows. Whatever
  a crash leaves between the commit and the recheck, the keeper's ``sweep`` finds.
- Resolution writes are conditional on ``status = 'blocked'``: a job is released or cancelled
  once, whoever resolves it (the worker, the recheck, the keeper's sweep).
- A job's rows stay while the job does: a retry puts a job that waits for something back to
  ``blocked`` and decides it again from them (``rewait``). A failure whose job or batch is gone
  stands (nothing can tell otherwise any more). Once the waiting job is gone, ``prune`` deletes
  its rows.
- No cycle: a new job is waited for only through the batch it joins, so ``add`` refuses a member
  whose dependencies wait, in turn, for its batch (``_refuse_a_cycle``; rows of transactions not
  yet committed are not seen).
- This module writes job rows only. Each function that cancels jobs hands their ids back to its
  caller (``ended``'s and ``sweep``'s ``cancelled`` list, ``add``'s ``on_cancelled``), which
  records them in their batches and sends ``job_cancelled`` (batch_outcomes.py;
  tests/test_batches.py::test_a_member_cancelled_by_its_dependency_finishes_its_batch_and_signals).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.db import transaction

from ..database import clock
from ..database.backends.inserts import batches
from ..database.backends.statements import placeholders
from ..database.validation import show
from ..database.validation import text as _text
from ..queue import ids
from .dependency_outcomes import CHUNK, LIVE, OnCancelled, _set_status, decide, recheck
from .members import open_batch

if TYPE_CHECKING:
    pass

logger = logging.getLogger("django_rws_jobs")

POLICIES = ("cancel", "run", "wait")


def policy(value: Any) -> str:
    if value not in POLICIES:
        raise ValueError(f"on_dependency_failure must be one of {', '.join(POLICIES)}, got {show(value)}")
    return str(value)


def targets(after: Any, policy_name: Any) -> list[tuple[str, bool]]:
    """``after`` checked: a list of job ids (str) and batches; (id, is a batch) each."""
    policy(policy_name)
    if isinstance(after, (str, bytes)) or not isinstance(after, (list, tuple)):
        raise TypeError(
            f"after must be a list of job ids and batches, got {type(after).__name__} {show(after)}"
            + (" (put a single id in a list)" if isinstance(after, str) else "")
        )
    if not after:
        raise ValueError("after must name at least one job or batch")
    found: dict[str, bool] = {}
    for item in after:
        if isinstance(item, str):
            found[_text("a job id in after", item, limit=64)] = False
        elif getattr(type(item), "is_rws_batch", False):  # batches.Batch or batches.batch
            found[item.id] = True
        else:
            raise TypeError(f"after takes job ids (str) and batches, got {type(item).__name__} {show(item)}")
    return list(found.items())


def add(
    conn: Any,
    job_id: str,
    deps: Sequence[tuple[str, bool]],
    policy: str,
    on_cancelled: OnCancelled | None = None,
) -> str:
    """Record what the job ``job_id`` (inserted blocked in this transaction) waits for, and
    resolve at once what has ended. Returns the job's status now. ``on_cancelled`` hears, after
    the commit, of the jobs this cancelled (it, or its recheck).

    It only reads the rows of what it waits for: the flag that tells their workers to resolve
    this job (``has_dependents``) is set by ``recheck`` after the caller commits, in a short
    transaction of its own, so that a caller's open transaction never holds a lock that a
    worker's renewal or outcome waits on
    (tests/test_dependencies.py::test_an_open_enqueue_after_a_running_job_does_not_hold_its_worker)."""
    with conn.cursor() as c:
        found = _current_outcomes(c, conn.alias, deps)
        inside = open_batch.get()
        if inside is not None and inside[1] == conn.alias:  # the job is a member of that batch
            _refuse_a_cycle(c, inside[0], found)
        # At most CHUNK parameters a statement, whatever the number of ids: SQLite builds take
        # 999 or 32,766, PostgreSQL 65,535
        # (tests/test_dependencies.py::test_after_takes_more_ids_than_one_statement_holds).
        for part in batches(iter(found), CHUNK // 5):
            c.execute(
                "INSERT INTO rws_job_dependencies (job_id, depends_on, on_batch, policy, outcome) VALUES "
                + ", ".join(["(%s, %s, %s, %s, %s)"] * len(part)),
                [v for dep, on_batch, outcome in part for v in (job_id, dep, on_batch, policy, outcome)],
            )
        status = decide([(policy, outcome) for _, _, outcome in found])
        if status != "blocked":
            _set_status(c, [job_id], status, int(clock.now(conn.alias)))
    alias = conn.alias
    already = [job_id] if status == "cancelled" else []
    transaction.on_commit(lambda: recheck(alias, [job_id], on_cancelled, already), using=alias)
    return status


#: How far (seconds) the id of a job that is gone may be ahead of this process's clock (and the
#: queue's) and still count as a job made before the enqueue: another host's clock may run ahead.
ID_CLOCK_SKEW = 60


def _current_outcomes(
    c: Any, alias: str, deps: Sequence[tuple[str, bool]]
) -> list[tuple[str, bool, str | None]]:
    """Each of ``deps`` as (id, whether it is a batch, its outcome: None while it has not ended).

    An id given as a string names a job, else a batch (``b.id``). One that names neither is a job
    that succeeded (and was deleted) only if this queue could have made it before now: an id of
    the form ``ids.new_id`` writes, whose time is not later than now; any other is refused, as a
    typo or an id of another database would otherwise run the job at once
    (tests/test_dependencies.py::test_after_refuses_an_id_that_names_nothing)."""
    statuses: dict[str, str] = {}
    for part in batches(iter([dep for dep, on_batch in deps if not on_batch]), CHUNK):
        c.execute(f"SELECT id, status FROM rws_jobs WHERE id IN ({placeholders(len(part))})", list(part))
        statuses.update((row[0], row[1]) for row in c.fetchall())
    states: dict[str, tuple[str, str | None]] = {}
    for part in batches(iter([dep for dep, on_batch in deps if on_batch or dep not in statuses]), CHUNK):
        c.execute(
            f"SELECT id, state, outcome FROM rws_batches WHERE id IN ({placeholders(len(part))})", list(part)
        )
        states.update((row[0], (row[1], row[2])) for row in c.fetchall())
    found: list[tuple[str, bool, str | None]] = []
    latest = max(time.time(), clock.now(alias)) + ID_CLOCK_SKEW
    for dep, on_batch in deps:
        if not on_batch and dep in statuses:
            found.append((dep, False, None if statuses[dep] in LIVE else "failed"))
        elif dep in states:
            state, outcome = states[dep]
            found.append(
                (dep, True, "failed" if state == "cancelled" else outcome if state == "finished" else None)
            )
        elif on_batch:
            raise ValueError(f"after names batch {dep}, which does not exist (or was pruned)")
        else:
            made = ids.made_at(dep)
            if made is None or made > latest:
                raise ValueError(
                    f"after names {show(dep)}, which is no job or batch in database {alias!r} and "
                    + ("not an id this queue makes" if made is None else "carries a time later than now")
                    + ": only a job id made before the enqueue whose job is gone counts as a success"
                )
            found.append((dep, False, "succeeded"))
    return found


#: Jobs and batches ``_refuse_a_cycle`` looks through at most; past it, it stops looking.
CYCLE_LOOK = 10_000


def _refuse_a_cycle(c: Any, batch_id: str, found: list[tuple[str, bool, str | None]]) -> None:
    """A member of ``batch_id`` (the batch open here) cannot wait for something that waits, in
    turn, for that batch: neither would ever end. Nothing waits for the new job itself yet, so a
    cycle closes only through its batch: look back from the batch through what waits for it (the
    jobs whose dependencies name it, the batches whose outstanding members those are, and so on)
    for one of the job's own dependencies that has not ended
    (tests/test_dependencies.py::test_a_dependency_cycle_through_open_batches_is_refused). One
    statement when nothing waits for the batch, as while a batch is open nothing usually does."""
    if any(is_batch and dep == batch_id for dep, is_batch, _ in found):
        raise ValueError(
            f"a job enqueued inside batch {batch_id} cannot wait for it: "
            "as a member, the batch would wait for it in turn"
        )
    open_deps = {dep for dep, _, outcome in found if outcome != "succeeded"}
    seen = {batch_id}
    frontier = [batch_id]
    first = True
    while frontier and len(seen) < CYCLE_LOOK:
        waiting: list[str] = []
        for part in batches(iter(frontier), CHUNK):
            marks = placeholders(len(part))
            c.execute(
                f"SELECT job_id, depends_on FROM rws_job_dependencies WHERE depends_on IN ({marks}) "
                "AND (outcome IS NULL OR (outcome = 'failed' AND policy = 'wait'))",
                list(part),
            )
            waiting += [row[0] for row in c.fetchall()]
            if not first:  # a batch waits for its outstanding members (a batch is no member)
                c.execute(
                    f"SELECT batch_id FROM rws_batch_members WHERE job_id IN ({marks}) AND outcome IS NULL",
                    list(part),
                )
                waiting += [row[0] for row in c.fetchall()]
        first = False
        frontier = [node for node in dict.fromkeys(waiting) if node not in seen]
        seen.update(frontier)
        closing = open_deps.intersection(frontier)
        if closing:
            dep = min(closing)
            raise ValueError(
                f"after names {dep}, which waits (through what it waits for) for batch {batch_id}, "
                "whose member this job is: a cycle, in which nothing would ever run"
            )
