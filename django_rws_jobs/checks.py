"""System checks for RWS_JOBS, with stable ids (rws_jobs.E0xx settings, E1xx schedules)."""

from __future__ import annotations

from numbers import Real
from typing import Any

from django.conf import settings
from django.core.checks import Error, Warning, register
from django.db import connections

from .conf import DEFAULTS, jobs_settings

TAG = "rws_jobs"


def _number(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# key -> (check id, test, what it must be)
RULES: dict[str, tuple[str, Any, str]] = {
    "DATABASE": ("rws_jobs.E002", lambda v: isinstance(v, str) and v in connections.settings,
                 "an alias in DATABASES"),
    "MAX_RETRIES": ("rws_jobs.E003", lambda v: _integer(v) and 0 <= v <= 2**31 - 1,
                    "an integer between 0 and 2147483647"),
    "BACKOFF_INITIAL": ("rws_jobs.E004", lambda v: _number(v) and v >= 0, "a number of seconds >= 0"),
    "BACKOFF_MULTIPLIER": ("rws_jobs.E005", lambda v: _number(v) and v >= 1, "a number >= 1"),
    "BACKOFF_MAX": ("rws_jobs.E006", lambda v: _number(v) and v > 0, "a number of seconds > 0"),
    "POLL_INTERVAL": ("rws_jobs.E007", lambda v: _number(v) and 0 < v <= 3600, "a number of seconds in (0, 3600]"),
    "LEASE_SECONDS": ("rws_jobs.E008", lambda v: _integer(v) and v >= 2, "an integer number of seconds >= 2"),
    "SHUTDOWN_TIMEOUT": ("rws_jobs.E009", lambda v: _number(v) and v >= 0, "a number of seconds >= 0"),
    "SCHEDULES": ("rws_jobs.E010", lambda v: isinstance(v, dict), "a dict of name -> schedule"),
    "RECOVERY_INTERVAL": ("rws_jobs.E011", lambda v: v is None or (_number(v) and v > 0),
                          "None or a number of seconds > 0"),
    "WORKER_SYNCHRONOUS_COMMIT": ("rws_jobs.E012", lambda v: isinstance(v, bool), "True or False"),
    "SQLITE_SETUP_ALIASES": ("rws_jobs.E014", lambda v: isinstance(v, (list, tuple)) and all(
        isinstance(a, str) and a in connections.settings for a in v), "a list of aliases in DATABASES"),
}


@register(TAG)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    raw = getattr(settings, "RWS_JOBS", {})
    if not isinstance(raw, dict):
        return [Error(f"RWS_JOBS must be a dict, got {type(raw).__name__}", id="rws_jobs.E001")]
    messages: list[Any] = []
    for key in sorted(set(raw) - set(DEFAULTS)):
        messages.append(Warning(f"RWS_JOBS has an unknown key {key!r}",
                                hint=f"known keys: {', '.join(DEFAULTS)}", id="rws_jobs.W001"))
    for key, (check_id, test, must) in RULES.items():
        value = getattr(jobs_settings, key)
        if not test(value):
            messages.append(Error(f"RWS_JOBS[{key!r}] is {value!r}; it must be {must}", id=check_id))
    return messages


@register(TAG)
def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    if not isinstance(jobs_settings.SCHEDULES, dict):
        return []  # reported by check_settings
    from .schedules import declared

    return [Error(str(e), id=e.check_id, obj=e.name) for e in declared()[1]]


@register(TAG, "database")
def check_database(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """The queue's SQL needs RETURNING (SQLite 3.35+)."""
    alias = jobs_settings.DATABASE
    if not isinstance(alias, str) or alias not in connections.settings:
        return []  # reported by check_settings
    if connections[alias].vendor == "sqlite":
        import sqlite3

        if sqlite3.sqlite_version_info < (3, 35):
            return [Error(f"SQLite {sqlite3.sqlite_version} is too old for django-rws-jobs; it needs 3.35 or "
                          "newer (UPDATE ... RETURNING)", id="rws_jobs.E013")]
    return []
