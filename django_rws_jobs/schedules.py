"""Cron schedules: each due time enqueued once across every process sharing the database."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, IntegrityError, connections, transaction

from . import cron
from .conf import jobs_settings
from .db import queue_alias
from .models import JobSchedule
from .registry import registry

logger = logging.getLogger("django_rws_jobs")

OPTION_KEYS = {"queue", "priority", "max_retries", "unique"}
KEYS = {"cron", "job_type", "payload"} | OPTION_KEYS


@dataclass(frozen=True)
class Schedule:
    name: str
    cron: str
    job_type: str
    payload: str = ""
    options: dict[str, Any] = field(default_factory=dict)


class ScheduleError(ValueError):
    def __init__(self, name: str, message: str, check_id: str):
        super().__init__(f"schedule {name!r}: {message}")
        self.name = name
        self.check_id = check_id


def declared() -> tuple[list[Schedule], list[ScheduleError]]:
    """Every schedule from RWS_JOBS['SCHEDULES'] and @job(schedule=...), and what is wrong with them."""
    from .api import prepare

    errors: list[ScheduleError] = []
    entries: list[tuple[str, Any]] = []
    configured = jobs_settings.SCHEDULES
    if not isinstance(configured, dict):
        return [], [ScheduleError("*", "RWS_JOBS['SCHEDULES'] must be a dict of name -> schedule", "rws_jobs.E100")]
    entries.extend(configured.items())
    for name, entry in registry.schedules.items():
        if name in configured:
            errors.append(ScheduleError(name, "is declared both in RWS_JOBS['SCHEDULES'] and on @job", "rws_jobs.E105"))
            continue
        entries.append((name, entry))
    out: list[Schedule] = []
    now = int(time.time())
    for name, entry in entries:
        if not isinstance(name, str) or not name or len(name) > 191:
            errors.append(ScheduleError(str(name), "the name must be a string of 1 to 191 characters", "rws_jobs.E104"))
            continue
        if not isinstance(entry, dict):
            errors.append(ScheduleError(name, f"must be a dict with 'cron' and 'job_type', got {entry!r:.60}", "rws_jobs.E104"))
            continue
        unknown = set(entry) - KEYS
        if unknown:
            errors.append(ScheduleError(name, f"unknown keys {sorted(unknown)}; allowed: {sorted(KEYS)}", "rws_jobs.E104"))
            continue
        try:
            cron.check_fires(entry.get("cron"), now)
        except cron.CronError as exc:
            check_id = "rws_jobs.E102" if "never fires" in str(exc) else "rws_jobs.E101"
            errors.append(ScheduleError(name, str(exc), check_id))
            continue
        job_type = entry.get("job_type")
        options = {k: entry[k] for k in OPTION_KEYS if k in entry}
        payload = entry.get("payload", "")
        try:
            prepare(job_type, payload, **options)
        except (TypeError, ValueError) as exc:
            errors.append(ScheduleError(name, f"bad job: {exc}", "rws_jobs.E104"))
            continue
        if job_type not in registry:
            errors.append(ScheduleError(name, f"job_type {job_type!r} has no registered handler", "rws_jobs.E103"))
            continue
        out.append(Schedule(name, cron.validate(entry["cron"]), job_type, payload, options))
    return out, errors


def valid_schedules() -> list[Schedule]:
    schedules, errors = declared()
    for error in errors:
        logger.error("%s (%s); it is not run", error, error.check_id)
    return schedules


def tick_schedules(now: int | None = None, *, using: str | None = None,
                   schedules: list[Schedule] | None = None) -> int:
    """Enqueue the due schedules' jobs; return how many this call enqueued.

    First sight stores the next due time strictly after ``now`` and enqueues nothing. A due row is
    claimed by a compare-and-set on its due time, and the job is enqueued in the same transaction,
    so each due time is enqueued once whatever the number of processes; missed due times collapse
    into one run. A changed expression takes effect at once. One schedule's failure is logged and
    does not stop the others.
    """
    alias = queue_alias(using)
    now = int(time.time()) if now is None else int(now)
    enqueued = 0
    for schedule in valid_schedules() if schedules is None else schedules:
        try:
            enqueued += _tick_one(schedule, now, alias)
        except Exception:
            logger.exception("schedule %r failed at %d", schedule.name, now)
    return enqueued


def _tick_one(schedule: Schedule, now: int, alias: str) -> int:
    from .api import enqueue

    rows = JobSchedule.objects.using(alias)
    row = rows.filter(name=schedule.name).values_list("next_run_at", "cron").first()
    nxt = cron.next_after(schedule.cron, now)
    if row is None:
        try:
            with transaction.atomic(using=alias):
                rows.create(name=schedule.name, next_run_at=nxt, cron=schedule.cron)
        except IntegrityError:
            pass  # another process saw it first; its row is as right as ours
        return 0
    due, stored_cron = row
    if stored_cron != schedule.cron:
        # A changed (or seed-written) expression: its next due time, from now on.
        rows.filter(name=schedule.name, next_run_at=due, cron=stored_cron).update(next_run_at=nxt, cron=schedule.cron)
        logger.info("schedule %r now runs %r; next due at %d", schedule.name, schedule.cron, nxt)
        return 0
    if due > now:
        return 0
    with transaction.atomic(using=alias):
        won = rows.filter(name=schedule.name, next_run_at=due, cron=schedule.cron).update(next_run_at=nxt)
        if won != 1:
            return 0
        job_id = enqueue(schedule.job_type, schedule.payload, using=alias, **schedule.options)
    logger.info("schedule %r due at %d enqueued job %s; next due at %d", schedule.name, due, job_id, nxt)
    return 1


def undeclared_rows(using: str | None = None) -> list[JobSchedule]:
    """Schedule rows that no declared schedule names (left alone; shown to operators)."""
    names = {s.name for s in declared()[0]}
    return [row for row in JobSchedule.objects.using(queue_alias(using)).order_by("name") if row.name not in names]


def scheduler_loop(stop: threading.Event, alias: str) -> None:
    """Tick schedules about once a second, just after each second starts, until ``stop``."""
    schedules = valid_schedules()
    if not schedules:
        return
    logger.info("scheduler running %d schedule(s): %s", len(schedules), ", ".join(s.name for s in schedules))
    try:
        while not stop.is_set():
            try:
                tick_schedules(using=alias, schedules=schedules)
            except DatabaseError as exc:
                logger.warning("scheduler: database error: %s", exc)
                connections[alias].close()
            stop.wait(1.0 - (time.time() % 1.0) + 0.005)
    finally:
        connections.close_all()
