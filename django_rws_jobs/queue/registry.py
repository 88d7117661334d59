"""Job handlers by job_type: the allow-list of what a worker may run."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from asgiref.sync import iscoroutinefunction
from django.utils.module_loading import autodiscover_modules, import_string

from ..database.validation import (
    INT32_MAX,
    INT64_MAX,
    INT64_MIN,
    concurrency_limit,
    integer,
    only_known,
    queue_name,
    show,
    text,
    timeout,
)
from .backoff import Backoff

Handler = Callable[[str], Any]

#: What @job and register() accept besides the handler: enqueue defaults, and what the worker
#: does with the type's failures (OUTCOME_OPTIONS, kept on the JobSpec, not passed to enqueue).
OUTCOME_OPTIONS = ("backoff", "fail_on")
OPTIONS = ("queue", "priority", "max_retries", "timeout", "concurrency_limit", "schedule", *OUTCOME_OPTIONS)
#: The job_type prefix of django.tasks rows (``django.tasks:<module path>``): reserved, no handler
#: may be registered under it (tests/test_tasks_backend.py::test_the_task_prefix_is_reserved).
TASK_PREFIX = "django.tasks:"


class RowRunner(Protocol):
    """Runs rows that no handler serves, by job_type prefix (the django.tasks rows). One that also
    has ``record_many(store, [(job, outcome), ...]) -> [str]`` gets the worker's outcomes of a
    completer batch in one call (worker/completer.py)."""

    def run(self, job: Any) -> Any:
        """Run the claimed row; return its outcome for ``record``."""

    def record(self, store: Any, job: Any, outcome: Any, expired_before: int | None) -> str:
        """Write the outcome, fenced on the claim: 'done', 'retry', 'dead' or 'lost'."""

    def failed(self, outcome: Any) -> bool:
        """Whether ``outcome`` (what ``run`` returned) is a failed attempt: its last progress
        report is then written at its end, as a failed handler's is."""


@dataclass(frozen=True)
class JobSpec:
    """A registered handler and the enqueue defaults declared with it."""

    job_type: str
    func: Handler
    options: dict[str, Any] = field(default_factory=dict)
    #: ``@job(backoff=)``: the wait before each retry of this type (backoff.py); None: RWS_JOBS's.
    backoff: Backoff | None = None
    #: ``@job(fail_on=)``: exceptions that fail a job of this type for good, as ``Fail`` does.
    fail_on: tuple[type[BaseException], ...] = ()
    #: ``func`` is an ``async def`` function: the worker runs it on an event loop of its own
    #: (run.call_handler). Found once here, not at every job.
    is_async: bool = field(init=False)

    def __post_init__(self) -> None:
        is_async = iscoroutinefunction(self.func) and not inspect.isasyncgenfunction(self.func)
        object.__setattr__(self, "is_async", is_async)


class Registry:
    def __init__(self) -> None:
        self._specs: dict[str, JobSpec] = {}
        self._lock = threading.Lock()
        # Schedules declared on @job(schedule=...): (declaring job_type, name, settings-style entry).
        # Every declaration is kept, so that a name declared twice is reported by a system check
        # (rws_jobs.E105) instead of one declaration silently winning.
        self._schedule_decls: list[tuple[str, Any, Any]] = []
        # job_type prefix -> runner (tasks/rows.py), or the dotted path of its class, made at the
        # first row of the prefix (so a worker that runs no such row does not import it)
        self.row_runners: dict[str, RowRunner | str] = {}

    def register(self, job_type: str, func: Handler, **options: Any) -> Handler:
        if not isinstance(job_type, str) or not job_type:
            raise TypeError(f"job_type must be a non-empty string, got {job_type!r}")
        text("job_type", job_type)
        if job_type.startswith(TASK_PREFIX):
            raise ValueError(
                f"job_type {show(job_type)} starts with {TASK_PREFIX!r}, which is reserved for "
                "django.tasks rows; use @task for a task"
            )
        if not callable(func):
            raise TypeError(f"the handler for job_type {job_type!r} must be callable, got {func!r}")
        _check_options(job_type, options)
        schedule = options.pop("schedule", None)
        backoff = options.pop("backoff", None)
        fail_on = options.pop("fail_on", ())
        with self._lock:
            existing = self._specs.get(job_type)
            if existing is not None and _unwrap(existing.func) is not _unwrap(func):
                raise ValueError(
                    f"job_type {job_type!r} is already registered to "
                    f"{_name(existing.func)}; cannot register {_name(func)} as well"
                )
            self._specs[job_type] = JobSpec(job_type, func, options, backoff, fail_on)
            if schedule is not None:
                # Registering again (a re-imported module) replaces this job_type's declarations.
                self._schedule_decls = [d for d in self._schedule_decls if d[0] != job_type]
                self._schedule_decls.extend(
                    (job_type, name, entry) for name, entry in _schedule_entries(job_type, schedule)
                )
        return func

    def unregister(self, job_type: str) -> None:
        with self._lock:
            self._specs.pop(job_type, None)
            self._schedule_decls = [d for d in self._schedule_decls if d[0] != job_type]

    def schedule_declarations(self) -> list[tuple[str, Any, Any]]:
        """Schedules declared on @job(schedule=...): (declaring job_type, name, entry), in order."""
        with self._lock:
            return list(self._schedule_decls)

    def get(self, job_type: str) -> JobSpec | None:
        return self._specs.get(job_type)

    def row_runner(self, job_type: str) -> RowRunner | None:
        """The runner of a row no handler serves, by its job_type's prefix (asked only once
        ``get`` found no handler, so a handler's row pays nothing for it)."""
        for prefix, runner in self.row_runners.items():
            if job_type.startswith(prefix):
                if isinstance(runner, str):  # two threads may both make one: runners keep no state
                    runner = self.row_runners[prefix] = import_string(runner)()
                return runner
        return None

    def __contains__(self, job_type: object) -> bool:
        return job_type in self._specs

    def job_types(self) -> list[str]:
        return sorted(self._specs)


def _check_options(job_type: str, options: dict[str, Any]) -> None:
    """Refuse unknown options and bad defaults at registration, with enqueue's own checks (a
    schedule's entries are the system checks' to report).
    (tests/test_input.py::test_job_options_are_checked_at_registration)"""
    try:
        only_known("option", options, OPTIONS)
        if "queue" in options:
            queue_name(options["queue"])
        if "priority" in options:
            integer("priority", options["priority"], INT64_MIN, INT64_MAX)
        if "max_retries" in options:
            integer("max_retries", options["max_retries"], 0, INT32_MAX)
        if "timeout" in options:
            timeout(options["timeout"])
        if options.get("concurrency_limit") is not None:
            concurrency_limit(options["concurrency_limit"])
        if "backoff" in options:
            options["backoff"] = Backoff.of(options["backoff"])
        if "fail_on" in options:
            options["fail_on"] = exception_classes("fail_on", options["fail_on"])
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"job_type {show(job_type)}: {exc}") from None


def exception_classes(name: str, value: Any) -> tuple[type[BaseException], ...]:
    """``fail_on=``: an exception class or a tuple (or list) of them, as a tuple."""
    classes = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    for cls in classes:
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            raise TypeError(f"{name} must be exception classes, got {type(cls).__name__} {show(cls)}")
    return classes


def _schedule_entries(job_type: str, schedule: Any) -> list[tuple[Any, Any]]:
    """Normalise ``schedule=`` ("cron", {"name":..., "cron":...}, or a list of them).

    What is wrong with an entry (a bad cron, an unknown key, a value that is not a dict, a name
    used twice) is left for the system checks to report with the schedule's name.
    """
    items = schedule if isinstance(schedule, (list, tuple)) else [schedule]
    out: list[tuple[Any, Any]] = []
    for item in items:
        if isinstance(item, str):
            entry: Any = {"cron": item, "job_type": job_type}
        elif isinstance(item, dict):
            entry = {"job_type": job_type, **item}
        else:
            entry = item
        name = entry.pop("name", None) if isinstance(entry, dict) else None
        out.append((name or job_type, entry))
    return out


def _unwrap(func: Handler) -> Any:
    return getattr(func, "__wrapped__", func)


def _name(func: Handler) -> str:
    return f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', repr(func))}"


registry = Registry()


def time_limit(own: float | None, job_type: str, default: float | None) -> tuple[float | None, str]:
    """A job's time limit in seconds and where it comes from: its own ``own`` ('own'), else its
    type's ``@job(timeout=)`` ('type'; None there means none), else ``default`` ('setting',
    RWS_JOBS["TIMEOUT"]). The worker enforces it (worker/timeouts.py); the admin shows it."""
    if own is not None:
        return float(own), "own"
    spec = registry.get(job_type)
    if spec is not None and "timeout" in spec.options:
        value = spec.options["timeout"]
        return (None if value is None else float(value)), "type"
    return default, "setting"


def register(job_type: str, func: Handler, **options: Any) -> Handler:
    """Register ``func`` as the handler of ``job_type``; a second, different function raises."""
    return registry.register(job_type, func, **options)


def job(job_type: str, **options: Any) -> Callable[[Handler], Handler]:
    """Decorate a function ``f(payload: str)`` as the handler of ``job_type``.

    ``queue``, ``priority`` and ``max_retries`` become this type's enqueue defaults; ``timeout``
    (seconds) its time limit, unless the job was enqueued with one; ``concurrency_limit`` how many
    jobs of this type with one ``concurrency_key`` may run at once (1 when not given);
    ``schedule="0 0 3 * * *"`` (or a dict with ``name``, ``cron``, ``payload`` and options, or a
    list of them) declares a cron schedule that enqueues it. ``backoff``: the wait before each
    retry of this type, a callable ``backoff(attempt, error) -> seconds`` (attempt 1 for the
    first retry) or a dict of ``initial``, ``multiplier``, ``max`` and ``jitter``; ``fail_on``:
    exception classes that fail the job for good, as ``Fail`` does.
    """

    def decorator(func: Handler) -> Handler:
        registry.register(job_type, func, **options)
        return func

    return decorator


def autodiscover() -> None:
    """Import the ``jobs`` module of every installed app, as the admin does with ``admin``."""

    autodiscover_modules("jobs")
