"""Cron schedules: each due time enqueued once across every process sharing the database.

Schedules come from ``RWS_JOBS["SCHEDULES"]`` and from ``@job(schedule=...)``. What is wrong with
one is a system check error (tag ``rws_jobs``, which ``rws_worker`` runs before it starts) naming
the schedule, with one of these ids:

- ``rws_jobs.E101``: the cron expression is invalid;
- ``rws_jobs.E102``: the cron expression can never fire (``0 0 0 30 2 *``);
- ``rws_jobs.E103``: no handler is registered for its job_type;
- ``rws_jobs.E104``: its shape or an option is wrong (not a dict, an unknown or missing key, a
  payload, queue, priority, max_retries or unique key that ``enqueue`` would refuse);
- ``rws_jobs.E105``: its name is declared more than once.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from django.core.checks import Error, register
from django.db import DatabaseError, IntegrityError, connections, transaction

from . import cron
from .checks import TAG
from .conf import jobs_settings
from .db import queue_alias
from .models import JobSchedule
from .registry import TASK_PREFIX, registry
from .validation import text

logger = logging.getLogger("django_rws_jobs")

BAD_CRON = "rws_jobs.E101"
NEVER_FIRES = "rws_jobs.E102"
UNKNOWN_JOB_TYPE = "rws_jobs.E103"
BAD_OPTION = "rws_jobs.E104"
DUPLICATE = "rws_jobs.E105"

OPTION_KEYS = ("queue", "priority", "max_retries", "unique")
JOB_KEYS = ("cron", "job_type", "payload", *OPTION_KEYS)
TASK_KEYS = ("cron", "task", "args", "kwargs")  # a schedule of a django.tasks task (tasks/scheduled.py)
KEYS = (*JOB_KEYS, *TASK_KEYS[1:])
NAME_MAX = 191  # rws_job_schedules.name is VARCHAR(191)
SETTINGS = "RWS_JOBS['SCHEDULES']"


@dataclass(frozen=True)
class Schedule:
    """A declared schedule: enqueue ``job_type`` with ``payload`` and ``options`` at each due time."""

    name: str
    cron: str  # the expression as written, whitespace normalised (stored in rws_job_schedules.cron)
    job_type: str
    payload: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    source: str = SETTINGS  # where it was declared: RWS_JOBS['SCHEDULES'] or @job('...')

    def next_after(self, t: int) -> int:
        """The first due time strictly after unix second ``t``."""
        return cron.parse(self.cron).next_after(t)


class ScheduleError(ValueError):
    """What is wrong with one declared schedule, with the id of its system check."""

    def __init__(self, name: Any, message: str, check_id: str):
        super().__init__(f"schedule {name!r}: {message}")
        self.name = name
        self.check_id = check_id


def declared() -> tuple[list[Schedule], list[ScheduleError]]:
    """The schedules from RWS_JOBS['SCHEDULES'] and @job(schedule=...), and what is wrong with them.

    A schedule with any error is not in the first list.
    """
    configured = jobs_settings.SCHEDULES
    if not isinstance(configured, dict):
        message = f"must be a dict of name -> schedule, got {type(configured).__name__}"
        return [], [ScheduleError(SETTINGS, message, "rws_jobs.E010")]
    entries = [(name, entry, SETTINGS) for name, entry in configured.items()]
    for job_type, name, entry in registry.schedule_declarations():
        entries.append((name, entry, f"@job({job_type!r})"))

    errors: list[ScheduleError] = []
    sources: dict[str, list[str]] = defaultdict(list)
    named = []
    for name, entry, source in entries:
        problem = _name_problem(name)
        if problem is not None:
            errors.append(ScheduleError(name, f"{problem} (declared in {source})", BAD_OPTION))
            continue
        sources[name].append(source)
        named.append((name, entry, source))
    for name, where in sources.items():
        if len(where) > 1:
            errors.append(
                ScheduleError(
                    name,
                    f"is declared {len(where)} times ({', '.join(where)}); schedule names must be unique",
                    DUPLICATE,
                )
            )

    schedules: list[Schedule] = []
    for name, entry, source in named:
        if len(sources[name]) > 1:
            continue
        schedule, problems = _check(name, entry, source)
        errors.extend(problems)
        if schedule is not None:
            schedules.append(schedule)
    return schedules, errors


def _shape_errors(name: str, entry: Any) -> list[ScheduleError]:
    """What is wrong with an entry's shape: not a dict, unknown keys, missing keys."""
    if not isinstance(entry, dict):
        return [
            ScheduleError(
                name,
                f"must be a dict with 'cron' and 'job_type' (optional: {', '.join(JOB_KEYS[2:])}) or "
                f"with 'cron' and 'task' (optional: {', '.join(TASK_KEYS[2:])}), "
                f"got {type(entry).__name__} {entry!r:.60}",
                BAD_OPTION,
            )
        ]
    unknown = [key for key in entry if key not in KEYS]
    missing = [key for key in ("cron", "task" if "task" in entry else "job_type") if key not in entry]
    problems = []
    if unknown:
        problems.append(
            ScheduleError(
                name,
                f"unknown key(s) {', '.join(map(repr, unknown))}; the keys are {', '.join(JOB_KEYS)} "
                f"(a task's: {', '.join(TASK_KEYS)})",
                BAD_OPTION,
            )
        )
    if missing:
        problems.append(ScheduleError(name, f"needs {' and '.join(map(repr, missing))}", BAD_OPTION))
    return problems


def _check(name: str, entry: Any, source: str) -> tuple[Schedule | None, list[ScheduleError]]:
    from .api import prepare

    def error(message: str, check_id: str) -> ScheduleError:
        return ScheduleError(name, message, check_id)

    shape = _shape_errors(name, entry)
    if shape:
        return None, shape
    problems = []
    try:
        expr = cron.parse(entry["cron"])
    except cron.CronNeverFires as exc:
        problems.append(error(str(exc), NEVER_FIRES))
    except cron.CronError as exc:
        problems.append(error(str(exc), BAD_CRON))
    job_type: Any = entry.get("job_type")
    payload = entry.get("payload", "")
    options = {key: entry[key] for key in OPTION_KEYS if key in entry}
    if "task" in entry:  # a django.tasks task (tasks/scheduled.py)
        from .tasks import scheduled

        job_type, payload, wrong = scheduled.check(entry)
        problems += [error(message, BAD_OPTION) for message in wrong]
    try:
        if not problems or "task" not in entry:
            prepare(job_type, payload, **options)
    except (TypeError, ValueError) as exc:
        problems.append(error(str(exc), BAD_OPTION))
    else:
        if job_type not in registry and "task" not in entry:
            problems.append(
                error(
                    f"job_type {job_type!r} has no registered handler; register one with "
                    f"@job({job_type!r}) in a jobs.py module",
                    UNKNOWN_JOB_TYPE,
                )
            )
    if problems:
        return None, problems
    return Schedule(name, expr.text, job_type, payload, options, source), []


@register(TAG)
def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    if not isinstance(jobs_settings.SCHEDULES, dict):
        return []  # reported by checks.check_settings
    return [Error(str(e), id=e.check_id, obj=e.name) for e in declared()[1]]


def valid_schedules() -> list[Schedule]:
    """The declared schedules that have no error; each error is logged."""
    schedules, errors = declared()
    for error in errors:
        logger.error("%s (%s); it does not run", error, error.check_id)
    return schedules


def _name_problem(name: Any) -> str | None:
    """What is wrong with a schedule's name, or None: 1 to NAME_MAX characters of text every
    database stores exactly, so one name cannot spoil the read of all the schedules' rows
    (tests/test_schedules.py::test_a_name_no_database_stores_is_a_check_error_and_the_others_run)."""
    if not isinstance(name, str) or not name or len(name) > NAME_MAX:
        return f"the name must be a string of 1 to {NAME_MAX} characters"
    try:
        text("the name", name)
    except ValueError as exc:
        return str(exc)
    return None


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
    now = int(time.time()) if now is None else int(now)
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
        logger.warning("schedules: database error at %d: %s", now, exc)
        return 0
    except Exception:  # a value the driver cannot send (a Schedule made past the checks): logged
        logger.exception("schedules: reading their rows failed at %d", now)
        return 0
    enqueued = 0
    for schedule in schedules:
        try:
            enqueued += _tick_one(schedule, stored.get(schedule.name), now, alias)
        except DatabaseError as exc:
            logger.warning("schedule %r: database error at %d: %s", schedule.name, now, exc)
        except Exception:
            logger.exception("schedule %r failed at %d", schedule.name, now)
    return enqueued


def _tick_one(schedule: Schedule, row: tuple[int, str | None] | None, now: int, alias: str) -> int:
    """Tick one schedule whose row read (next_run_at, cron) or None; return 1 if it enqueued."""
    from .api import enqueue

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
        logger.info("schedule %r first seen; next due at %d", schedule.name, nxt)
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
                    "schedule %r is now %r (was %r); next due at %d", schedule.name, expr.text, stored, nxt
                )
        return 0
    # Due (whatever expression stored it): claim this due time, and enqueue in the same transaction.
    with transaction.atomic(using=alias):
        if rows.filter(name=schedule.name, next_run_at=due).update(next_run_at=nxt, cron=expr.text) != 1:
            return 0  # another process claimed it
        if schedule.job_type.startswith(TASK_PREFIX):
            from .tasks import scheduled

            job_id = scheduled.enqueue(schedule.job_type, schedule.payload)
        else:
            job_id = enqueue(schedule.job_type, schedule.payload, using=alias, **schedule.options)
    logger.info("schedule %r due at %d enqueued job %s; next due at %d", schedule.name, due, job_id, nxt)
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
            "schedule %r had the due time %r, not an integer (was %r); next due at %d", name, due, stored, nxt
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
