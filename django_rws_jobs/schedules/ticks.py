"""Cron schedules: each due time enqueued once across every process sharing the database.

The schedules and their checks are in declared.py; this module ticks them.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import DatabaseError, IntegrityError, connections, transaction

from ..api.enqueue import enqueue
from ..database import clock
from ..database.connections import queue_alias
from ..models import JobSchedule
from ..queue.registry import TASK_PREFIX
from ..tasks import scheduled
from . import cron
from .declared import Schedule, ScheduleError, check_schedules, declared, valid_schedules

logger = logging.getLogger("django_rws_jobs")

__all__ = [
    "Schedule",
    "ScheduleError",
    "check_schedules",
    "declared",
    "tick_schedules",
    "undeclared_rows",
    "valid_schedules",
]


def tick_schedules(
    now: int | None = None, *, using: str | None = None, schedules: list[Schedule] | None = None
) -> int:
    """Enqueue the jobs of the schedules that are due at ``now``; return how many this call enqueued.

    The first time a schedule is seen, its row gets the next due time strictly after ``now`` and
    nothing is enqueued. A due row is claimed by one compare-and-set on its due time, and the job
    is enqueued in the same transaction: each due time is enqueued once however many processes
    tick, and a crash cannot lose or double it. Due times missed while nothing ticked collapse into
    one run. A changed expression (or a row written by rust-web-server, which stores none) takes
    effect at once. One schedule's failure is logged and does not stop the others.
    """
    alias = queue_alias(using)
    now = int(clock.now(alias)) if now is None else int(now)
    schedules = valid_schedules() if schedules is None else schedules
    if not schedules:
        return 0
    # One read for all of them: when nothing is due, a tick costs this one query.
    try:
        stored = {
            name: (due, expr)
            for name, due, expr in JobSchedule.objects.using(alias)
            .filter(name__in=[s.name for s in schedules])
            .values_list("name", "next_run_at", "cron")
        }
    except DatabaseError as exc:
        logger.warning("schedules: database error at %s: %s", clock.iso(now), exc)
        return 0
    except Exception:  # a value the driver cannot send (a Schedule made past the checks): logged
        logger.exception("schedules: reading their rows failed at %s", clock.iso(now))
        return 0
    enqueued = 0
    for schedule in schedules:
        try:
            enqueued += _tick_one(schedule, stored.get(schedule.name), now, alias)
        except DatabaseError as exc:
            logger.warning("schedule %r: database error at %s: %s", schedule.name, clock.iso(now), exc)
        except Exception:
            logger.exception("schedule %r failed at %s", schedule.name, clock.iso(now))
    return enqueued


def _tick_one(schedule: Schedule, row: tuple[int, str | None] | None, now: int, alias: str) -> int:
    """Tick one schedule whose row read (next_run_at, cron) or None; return 1 if it enqueued."""

    expr = cron.parse(schedule.cron)
    nxt = expr.next_after(now)
    rows = JobSchedule.objects.using(alias)
    # Every write is in an atomic block of its own, so that inside a caller's transaction a
    # database error in one schedule rolls back to a savepoint and spares the others.
    if row is None:
        try:
            with transaction.atomic(using=alias):
                rows.create(name=schedule.name, next_run_at=nxt, cron=expr.text)
        except IntegrityError:
            return 0  # another process saw it first at the same moment; its row is as right as ours
        logger.info("schedule %r first seen; next due at %s", schedule.name, clock.iso(nxt))
        return 0
    due, stored = row
    if isinstance(due, bool) or not isinstance(due, int):
        return _repair(schedule.name, due, stored, nxt, expr.text, alias)
    if due > now:
        if stored != expr.text:
            # A changed expression, or a rust-web-server writer's row (no expression): the next due time is
            # the new expression's, from now on, not the one stored for the old expression.
            with transaction.atomic(using=alias):
                changed = rows.filter(name=schedule.name, next_run_at=due, cron=stored).update(
                    next_run_at=nxt, cron=expr.text
                )
            if changed:
                logger.info(
                    "schedule %r is now %r (was %r); next due at %s",
                    schedule.name,
                    expr.text,
                    stored,
                    clock.iso(nxt),
                )
        return 0
    # Due (whatever expression stored it): claim this due time, and enqueue in the same transaction.
    with transaction.atomic(using=alias):
        if rows.filter(name=schedule.name, next_run_at=due).update(next_run_at=nxt, cron=expr.text) != 1:
            return 0  # another process claimed it
        if schedule.job_type.startswith(TASK_PREFIX):
            job_id = scheduled.enqueue(schedule.job_type, schedule.payload)
        else:
            job_id = enqueue(schedule.job_type, schedule.payload, using=alias, **schedule.options)
    # DEBUG: a schedule every few seconds would fill the log; the scheduler logs a count a minute
    # (worker/scheduler.py).
    logger.debug(
        "schedule %r due at %s enqueued job %s; next due at %s",
        schedule.name,
        clock.iso(due),
        job_id,
        clock.iso(nxt),
    )
    return 1


def _repair(name: str, due: Any, stored: str | None, nxt: int, text: str, alias: str) -> int:
    """A row whose due time is not an integer (SQLite keeps the REAL or TEXT another program
    wrote): give it the next due time after now, compared with the value as it is stored, which
    the model's integer field would round (tests/test_schedules.py::
    test_a_due_time_that_is_not_an_integer_is_replaced_not_skipped_for_ever). Enqueues nothing."""
    with transaction.atomic(using=alias), connections[alias].cursor() as c:
        c.execute(
            "UPDATE rws_job_schedules SET next_run_at = %s, cron = %s WHERE name = %s AND next_run_at = %s",
            [nxt, text, name, due],
        )
        changed = c.rowcount
    if changed:
        logger.warning(
            "schedule %r had the due time %r, not an integer (was %r); next due at %s",
            name,
            due,
            stored,
            clock.iso(nxt),
        )
    return 0


def undeclared_rows(using: str | None = None) -> list[JobSchedule]:
    """Schedule rows that no schedule declared here names: left alone, and shown to operators.

    They may belong to a schedule that was removed or renamed, or to another deployment (such as
    rust-web-server) sharing the table. Delete a row to forget it.
    """
    schedules, errors = declared()
    names = {s.name for s in schedules} | {e.name for e in errors if isinstance(e.name, str)}
    rows = JobSchedule.objects.using(queue_alias(using)).order_by("name")
    return [row for row in rows if row.name not in names]
