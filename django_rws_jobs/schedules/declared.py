"""The cron schedules declared in ``RWS_JOBS["SCHEDULES"]`` and by ``@job(schedule=...)``, and
what is wrong with them. Each problem is a system check error (tag ``rws_jobs``, which
``rws_worker`` runs before it starts) naming the schedule, with one of these ids:

- ``rws_jobs.E101``: the cron expression is invalid;
- ``rws_jobs.E102``: the cron expression can never fire (``0 0 0 30 2 *``);
- ``rws_jobs.E103``: no handler is registered for its job_type;
- ``rws_jobs.E104``: its shape, name or an option is wrong (not a dict, an unknown or missing key,
  a name no database stores, a payload, queue, priority, max_retries or unique key that
  ``enqueue`` would refuse);
- ``rws_jobs.E105``: its name is declared more than once.

ticks.py ticks them.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from django.core.checks import Error, register

from ..checks import TAG
from ..conf import jobs_settings
from ..database.validation import text
from ..queue.registry import registry
from ..tasks import scheduled
from . import cron

logger = logging.getLogger("django_rws_jobs")

BAD_CRON = "rws_jobs.E101"
NEVER_FIRES = "rws_jobs.E102"
UNKNOWN_JOB_TYPE = "rws_jobs.E103"
BAD_OPTION = "rws_jobs.E104"
DUPLICATE = "rws_jobs.E105"

OPTION_KEYS = ("queue", "priority", "max_retries", "unique", "concurrency_key", "metadata")
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
    from ..api.enqueue import prepare  # (loads the models; settings may import this module)

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
