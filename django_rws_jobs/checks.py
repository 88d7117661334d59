"""System checks for RWS_JOBS, with stable ids (rws_jobs.E0xx settings; the E1xx schedule checks are
in schedules/declared.py, which this module does not import: tick() and Worker() use
require_valid_settings, and the schedules use the public API). The part above ``flow``: it checks
the queue limits with flow's own parsers, and ``queue``, ``schedules`` and ``worker`` use it."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.checks import Error, Warning, register
from django.db import connections

from .conf import DEFAULTS, jobs_settings
from .database.validation import INT32_MAX, show
from .flow.limits import entry_where, parse_concurrency, parse_rate, queues_dict

TAG = "rws_jobs"
DAY, WEEK, YEAR = 86400, 7 * 86400, 365 * 86400
SECONDS = "a number of seconds"


def _bounded(
    what: str, lo: int, hi: int, *, above: bool = False, integer: bool = False
) -> tuple[Callable[[Any], bool], str]:
    """A test that a value is a finite int (or float) in [lo, hi] ((lo, hi] if ``above``), and
    its words: Python's int and float, not bool, never nan or inf."""

    def test(value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
            return False
        if isinstance(value, float) and not math.isfinite(value):
            return False
        return (lo < value if above else lo <= value) and value <= hi

    return test, f"{what} in {'(' if above else '['}{lo}, {hi}]"


def _optional(rule: tuple[Callable[[Any], bool], str]) -> tuple[Callable[[Any], bool], str]:
    test, must = rule
    return (lambda v: v is None or test(v)), f"None or {must}"


# key -> (check id, test, what it must be). The bounds keep every delay a finite number that
# time.monotonic() + delay, thread joins and the BIGINT columns hold
# (tests/test_checks.py::test_each_bad_setting_has_its_own_id). Worker() and tick() refuse to run
# with a value that fails (require_valid_settings), and rws_worker's --poll-interval and
# Worker(poll_interval=) go through the same rule
# (tests/test_input.py::test_worker_refuses_bad_arguments_and_settings).
RULES: dict[str, tuple[str, Callable[[Any], bool], str]] = {
    "DATABASE": (
        "rws_jobs.E002",
        lambda v: isinstance(v, str) and v in connections.settings,
        "an alias in DATABASES",
    ),
    "MAX_RETRIES": ("rws_jobs.E003", *_bounded("an integer", 0, INT32_MAX, integer=True)),
    "BACKOFF_INITIAL": ("rws_jobs.E004", *_bounded(SECONDS, 0, YEAR)),
    "BACKOFF_MULTIPLIER": ("rws_jobs.E005", *_bounded("a number", 1, 1000)),
    "BACKOFF_MAX": ("rws_jobs.E006", *_bounded(SECONDS, 0, YEAR, above=True)),
    "BACKOFF_JITTER": (
        "rws_jobs.E031",
        lambda v: _bounded("", 0, 1)[0](v) and v < 1,
        "a number in [0, 1)",
    ),
    "POLL_INTERVAL": ("rws_jobs.E007", *_bounded(SECONDS, 0, 3600, above=True)),
    "LEASE_SECONDS": ("rws_jobs.E008", *_bounded("an integer number of seconds", 2, WEEK, integer=True)),
    "SHUTDOWN_TIMEOUT": ("rws_jobs.E009", *_bounded(SECONDS, 0, DAY)),
    "SCHEDULES": ("rws_jobs.E010", lambda v: isinstance(v, dict), "a dict of name -> schedule"),
    "RECOVERY_INTERVAL": ("rws_jobs.E011", *_optional(_bounded(SECONDS, 0, DAY, above=True))),
    "WORKER_SYNCHRONOUS_COMMIT": ("rws_jobs.E012", lambda v: isinstance(v, bool), "True or False"),
    "TIMEOUT": ("rws_jobs.E015", *_optional(_bounded(SECONDS, 0, WEEK, above=True))),
    "TIMEOUT_GRACE": ("rws_jobs.E016", *_bounded(SECONDS, 0, 3600, above=True)),
    "STATEMENT_DEADLINE": ("rws_jobs.E017", *_optional(_bounded(SECONDS, 1, DAY))),
    "CANCELLED_RETENTION": ("rws_jobs.E021", *_bounded(SECONDS, 0, 100 * YEAR)),
    "METRICS_RETENTION": ("rws_jobs.E022", *_bounded(SECONDS, 3600, 100 * YEAR)),
    "METRICS_TOKEN": (
        "rws_jobs.E023",
        lambda v: v is None or (isinstance(v, str) and len(v) >= 16),
        "None or a str of at least 16 characters",
    ),
    "METADATA_MAX_BYTES": (
        "rws_jobs.E026",
        *_bounded("an integer number of bytes", 2, 16 * 2**20, integer=True),
    ),
    "BATCH_RETENTION": ("rws_jobs.E027", *_bounded(SECONDS, 0, 100 * YEAR)),
    "OUTPUT_MAX_BYTES": (
        "rws_jobs.E028",
        *_bounded("an integer number of bytes", 2, 16 * 2**20, integer=True),
    ),
    "CHECKPOINT_INTERVAL": ("rws_jobs.E032", *_bounded(SECONDS, 0, 3600, above=True)),
    "MIDDLEWARE": ("rws_jobs.E029", lambda v: _middleware_paths(v), "a list of dotted paths to classes"),
    "OTEL_PARENT": ("rws_jobs.E030", lambda v: v in ("link", "child"), '"link" or "child"'),
    "POOLER": (
        "rws_jobs.E024",
        lambda v: v in (None, "transaction", "session"),
        'None, "transaction" or "session"',
    ),
    "LISTEN_DATABASE": (
        "rws_jobs.E025",
        lambda v: v is None or (isinstance(v, str) and v in connections.settings),
        "None or an alias in DATABASES",
    ),
    "SQLITE_SETUP_ALIASES": (
        "rws_jobs.E014",
        lambda v: (
            isinstance(v, (list, tuple)) and all(isinstance(a, str) and a in connections.settings for a in v)
        ),
        "a list of aliases in DATABASES",
    ),
}


def _middleware_paths(value: Any) -> bool:
    """Whether ``value`` lists dotted paths that import as classes (queue/middleware.py)."""
    from django.utils.module_loading import import_string

    if not isinstance(value, (list, tuple)) or not all(isinstance(p, str) for p in value):
        return False
    try:
        return all(isinstance(import_string(p), type) for p in value)
    except ImportError:
        return False


def check_value(key: str, value: Any, name: str) -> Any:
    """``value`` if it passes RULES[key]; else TypeError (not a number) or ValueError naming
    ``name``, the value and the bounds."""
    _, test, must = RULES[key]
    if test(value):
        return value
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    raise (ValueError if number else TypeError)(f"{name} is {show(value)}; it must be {must}")


def require_valid_settings() -> None:
    """Raise ValueError naming every RWS_JOBS value that fails its system check."""
    errors = [m for m in check_settings() if m.is_serious()]
    if errors:
        raise ValueError("; ".join(f"{m.msg} ({m.id})" for m in errors))


@register(TAG)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    raw = getattr(settings, "RWS_JOBS", {})
    if not isinstance(raw, dict):
        return [Error(f"RWS_JOBS must be a dict, got {type(raw).__name__}", id="rws_jobs.E001")]
    messages: list[Any] = []
    for key in sorted(set(raw) - set(DEFAULTS), key=repr):  # keys of any types
        messages.append(
            Warning(
                f"RWS_JOBS has an unknown key {show(key)}",
                hint=f"known keys: {', '.join(DEFAULTS)}",
                id="rws_jobs.W001",
            )
        )
    for key, (check_id, test, must) in RULES.items():
        value = getattr(jobs_settings, key)
        if not test(value):
            messages.append(Error(f"RWS_JOBS[{key!r}] is {show(value)}; it must be {must}", id=check_id))
    return messages + check_queue_limits(jobs_settings.QUEUES)


def check_queue_limits(raw: Any) -> list[Any]:
    """RWS_JOBS["QUEUES"]'s checks:

    - ``rws_jobs.E018``: its shape, a queue's name or an unknown key is wrong;
    - ``rws_jobs.E019``: a queue's ``concurrency`` is not an integer from 1 to 100000;
    - ``rws_jobs.E020``: a queue's ``rate_limit`` is not "N/s", "N/m" or "N/h" with N from 1 to 1000000.
    """

    try:
        entries = queues_dict(raw)
    except TypeError as exc:
        return [Error(str(exc), id="rws_jobs.E018")]
    messages: list[Any] = []
    for name, value in entries.items():
        try:
            where = entry_where(name, value)
        except (TypeError, ValueError) as exc:
            messages.append(Error(str(exc), id="rws_jobs.E018"))
            continue
        for check_id, key, parse in (
            ("rws_jobs.E019", "concurrency", parse_concurrency),
            ("rws_jobs.E020", "rate_limit", parse_rate),
        ):
            if value.get(key) is not None:
                try:
                    parse(value[key], f"{where}[{key!r}]")
                except (TypeError, ValueError) as exc:
                    messages.append(Error(str(exc), id=check_id))
    return messages


@register(TAG)
def check_database(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """The queue's SQL needs RETURNING (SQLite 3.35+). It reads the driver, never the server, so it
    is not tagged ``database``: Django 6.1 leaves those out of a plain ``manage.py check``, and a
    user expects this one in it on every series (tests/test_checks.py::
    test_a_plain_check_reports_a_too_old_sqlite)."""
    alias = jobs_settings.DATABASE
    if not isinstance(alias, str) or alias not in connections.settings:
        return []  # reported by check_settings
    from .database.backends import backend_for  # (loads the models; settings may import this module)

    return backend_for(connections[alias]).check()
