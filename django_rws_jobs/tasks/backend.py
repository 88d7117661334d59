"""``RwsJobsBackend``: Django's ``@task`` API on the queue's tables.

Importing this module touches neither models nor the database: Django makes the backend when a
module with ``@task`` is imported, which may be before the app registry is ready.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

from django.core import checks
from django.db import connections

from ..conf import jobs_settings
from ..database.validation import KEY_MAX, concurrency_limit, queue_name, text, timeout
from ..queue import middleware
from ..queue.backoff import Backoff
from ..queue.metadata import metadata_text
from ..queue.registry import TASK_PREFIX, exception_classes
from . import history
from .compat import (
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskResult,
    TaskResultStatus,
    normalize_json,
    task_enqueued,
)
from .results import OPTIONS, RwsTaskResult, fetch, load_task

#: OPTIONS this backend reads.
OPTION_KEYS = ("MAX_ATTEMPTS", "RESULTS_RETENTION", "DATABASE")
#: The default RESULTS_RETENTION: seven days, in seconds.
DEFAULT_RETENTION = 7 * 24 * 3600


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RwsTask(Task):
    """A task with this backend's options: ``max_attempts`` (None: the backend's budget),
    ``unique`` (True: while a task of this function with the same arguments waits or runs,
    ``enqueue`` returns its result instead of adding another) and ``timeout`` (seconds an attempt
    may run; None: RWS_JOBS["TIMEOUT"]), stored as the row's own limit; ``concurrency_key`` (a
    str, or a function of the task's arguments that returns one) and ``concurrency_limit`` (how
    many tasks with one key run at once; None: 1); ``backoff`` and ``fail_on`` as ``@job``'s
    (docs/howto/outcomes.md)."""

    max_attempts: int | None = None
    unique: bool = False
    timeout: float | None = None
    concurrency_key: str | Callable[..., str] | None = None
    concurrency_limit: int | None = None
    backoff: Backoff | None = dataclasses.field(default=None, compare=False)
    fail_on: tuple[type[BaseException], ...] = dataclasses.field(default=(), compare=False)
    #: The metadata each enqueue of this task stores with it (``using(metadata={...})``).
    metadata: dict[str, Any] | None = dataclasses.field(default=None, compare=False)
    #: With ``unique``: seconds the arguments' key stays taken from the enqueue that took it, even
    #: once that task finished; an enqueue inside the window returns that task's result (a throttle).
    unique_for: float | None = None

    def using(self, *, metadata: dict[str, Any] | None = None, **changes: Any) -> RwsTask:
        """Django's ``using()`` (priority, queue_name, run_after, backend), and ``metadata``: a
        dict the enqueued task carries (``context.metadata`` in the task; the result's
        ``metadata``), as Django's metadata proposal names it."""
        task: RwsTask = Task.using(self, **changes) if changes else self
        return task if metadata is None else task.with_options(metadata=metadata)

    def with_options(
        self,
        *,
        max_attempts: int | None = None,
        unique: bool | None = None,
        timeout: float | None = None,
        concurrency_key: str | Callable[..., str] | None = None,
        concurrency_limit: int | None = None,
        metadata: dict[str, Any] | None = None,
        backoff: Any = None,
        fail_on: Any = None,
        unique_for: Any = None,
    ) -> RwsTask:
        """A copy with other options (``using()`` for this backend's options)."""
        try:
            if metadata is not None:
                metadata_text(metadata)
            if unique_for is not None:
                from ..api.enqueue_once import once_options  # (loads the models; see the module's docstring)

                once_options(unique if unique is not None else self.unique or None, "skip", None, unique_for)
            backoff = Backoff.of(backoff)
            fail_on = None if fail_on is None else exception_classes("fail_on", fail_on)
        except (TypeError, ValueError) as exc:
            raise InvalidTask(str(exc)) from None
        given: dict[str, Any] = {
            "max_attempts": max_attempts,
            "unique": unique,
            "timeout": timeout,
            "concurrency_key": concurrency_key,
            "concurrency_limit": concurrency_limit,
            "metadata": metadata,
            "backoff": backoff,
            "fail_on": fail_on,
            "unique_for": unique_for,
        }
        return dataclasses.replace(self, **{k: v for k, v in given.items() if v is not None})


class RwsJobsBackend(BaseTaskBackend):
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True
    task_class = RwsTask

    # -- options ---------------------------------------------------------------------------------

    @property
    def database(self) -> str:

        return self.options.get("DATABASE") or jobs_settings.DATABASE

    def max_attempts(self, task: Task) -> int:
        """The task's budget: its own, else OPTIONS["MAX_ATTEMPTS"], else RWS_JOBS MAX_RETRIES + 1."""
        own = getattr(task, "max_attempts", None)
        if own is not None:
            return int(own)
        if self.options.get("MAX_ATTEMPTS") is not None:
            return int(self.options["MAX_ATTEMPTS"])

        return int(jobs_settings.MAX_RETRIES) + 1

    @property
    def retention(self) -> float | None:
        """Seconds a result is kept (OPTIONS["RESULTS_RETENTION"], seconds or a timedelta); None: for ever."""
        value = self.options.get("RESULTS_RETENTION", DEFAULT_RETENTION)
        if isinstance(value, dt.timedelta):
            return value.total_seconds()
        return None if value is None else float(value)

    # -- validation ------------------------------------------------------------------------------

    def validate_task(self, task: Task) -> None:
        """Django's checks, then what could never run in a worker, as InvalidTask."""
        func = task.func
        if getattr(func, "__module__", None) == "__main__":
            raise InvalidTask(
                "Task function must be defined at a module level: one defined in __main__ cannot be "
                "imported by a worker."
            )
        run_after = task.run_after
        if run_after is not None and not isinstance(run_after, dt.datetime):
            raise InvalidTask(f"run_after must be an aware datetime, not {type(run_after).__name__}.")
        super().validate_task(task)

        try:  # the queue's own rules (64 characters, no comma...), when the task is made, as Django's
            queue_name(task.queue_name)
        except (TypeError, ValueError) as exc:
            raise InvalidTask(str(exc)) from None
        if isinstance(task, RwsTask) and task.max_attempts is not None:
            if isinstance(task.max_attempts, bool) or not isinstance(task.max_attempts, int):
                raise InvalidTask(f"max_attempts must be a whole number, not {task.max_attempts!r}.")
            if not 1 <= task.max_attempts <= 2**31:
                raise InvalidTask(f"max_attempts must be between 1 and {2**31}, not {task.max_attempts}.")
        if isinstance(task, RwsTask) and task.timeout is not None:
            try:
                timeout(task.timeout)
            except (TypeError, ValueError) as exc:
                raise InvalidTask(str(exc)) from None
        if isinstance(task, RwsTask):
            self._validate_concurrency(task)

    def _validate_concurrency(self, task: RwsTask) -> None:

        try:
            if task.concurrency_limit is not None:
                concurrency_limit(task.concurrency_limit)
            key = task.concurrency_key
            if isinstance(key, str):
                text("concurrency_key", key, limit=KEY_MAX)
            elif key is not None and not callable(key):
                raise TypeError(
                    f"concurrency_key must be a str or a function of the task's arguments, got "
                    f"{type(key).__name__} {key!r}"
                )
        except (TypeError, ValueError) as exc:
            raise InvalidTask(str(exc)) from None

    # -- enqueue ---------------------------------------------------------------------------------

    def enqueue(self, task: Task, args: Sequence[Any], kwargs: dict[str, Any]) -> TaskResult:
        """Insert the task's row in the caller's transaction; return its READY result."""
        from ..api.enqueue import insert_prepared  # (loads the models; see the module's docstring)
        from ..api.enqueue_once import Once  # (loads the models; see the module's docstring)

        params = self.job_params(task, args, kwargs)
        window = getattr(task, "unique_for", None)
        once = Once(False, None, float(window)) if window is not None and params[-1] is not None else None
        stored = history.load(params[2])  # the arguments as JSON made them, the time of enqueue
        enqueuers = middleware.chains()[0]
        if enqueuers:
            own = getattr(task, "metadata", None)
            job = middleware.Enqueue(params[1], params[6], dict(own or {}), False, self.database)

            def call_next() -> str:
                params[15] = middleware.merged(None, job.metadata) if job.metadata else None
                job.ids = [insert_prepared(self.database, params, once=once)]
                return job.ids[0]

            job_id = middleware.enqueue_around(enqueuers, job, call_next)
        else:
            job_id = insert_prepared(self.database, params, once=once)
        if job_id != params[0]:  # a unique task already waits or runs: its result
            return self.get_result(job_id)

        result = RwsTaskResult(
            metadata=None if params[15] is None else json.loads(params[15]),
            task=task,
            id=job_id,
            status=TaskResultStatus.READY,
            enqueued_at=history.when(stored["enqueued_at"]),
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=stored["args"],
            kwargs=stored["kwargs"],
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        task_enqueued.send(type(self), task_result=result)
        return result

    def job_params(self, task: Task, args: Sequence[Any], kwargs: dict[str, Any]) -> list[Any]:
        """The task's row as ``api.prepare`` makes one (enqueue's and enqueue_many's)."""
        from ..api.enqueue import prepare  # (loads the models; see the module's docstring)
        from ..database import clock  # (loads the models; see the module's docstring)

        self.validate_task(task)
        declared = _check_importable(task)
        args, kwargs = arguments(args, kwargs)
        now = clock.now(self.database)
        unique = unique_key(task, args, kwargs) if getattr(task, "unique", False) else None
        key = getattr(task, "concurrency_key", None)
        if callable(key):
            key = key(*args, **kwargs)  # the arguments as the worker will see them
            if not isinstance(key, str):
                raise InvalidTask(
                    f"concurrency_key of {task.module_path} must return a str, returned "
                    f"{type(key).__name__} {key!r}"
                )
        try:  # what the queue refuses besides Django's checks (a queue name over 64 characters)
            return prepare(
                TASK_PREFIX + task.module_path,
                history.payload(args, kwargs, self.alias, task.run_after, now, _options(task, declared)),
                queue=task.queue_name,
                priority=whole(task.priority),
                run_at=task.run_after,
                unique=unique,
                max_retries=self.max_attempts(task) - 1,
                timeout=getattr(task, "timeout", None),
                concurrency_key=key,
                concurrency_limit=getattr(task, "concurrency_limit", None),
                metadata=getattr(task, "metadata", None),
                now=now,
            )
        except (TypeError, ValueError) as exc:
            raise InvalidTask(str(exc)) from None

    # -- results ---------------------------------------------------------------------------------

    def get_result(self, result_id: str) -> TaskResult:

        return fetch(self.database, result_id, TASK_PREFIX, self.alias)

    # -- checks ----------------------------------------------------------------------------------

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        found = list(super().check(**kwargs))
        unknown = sorted(set(self.options) - set(OPTION_KEYS))
        if unknown:
            found.append(
                checks.Error(
                    f"TASKS[{self.alias!r}]['OPTIONS'] has unknown keys: {', '.join(unknown)}",
                    hint=f"known: {', '.join(OPTION_KEYS)}",
                    id="rws_jobs.E201",
                )
            )
        found += self._check_values()
        from django.apps import apps

        if not apps.is_installed("django_rws_jobs"):
            found.append(
                checks.Error(
                    f"TASKS[{self.alias!r}] uses RwsJobsBackend, "
                    "but django_rws_jobs is not in INSTALLED_APPS",
                    hint="add 'django_rws_jobs' to INSTALLED_APPS and run migrate: it holds the tables",
                    id="rws_jobs.E206",
                )
            )
        return found

    def _check_values(self) -> list[checks.CheckMessage]:
        found: list[checks.CheckMessage] = []
        where = f"TASKS[{self.alias!r}]['OPTIONS']"
        attempts = self.options.get("MAX_ATTEMPTS")
        if attempts is not None and (
            isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1
        ):
            found.append(
                checks.Error(
                    f"{where}['MAX_ATTEMPTS'] must be a whole number >= 1, got {attempts!r}",
                    id="rws_jobs.E202",
                )
            )
        keep = self.options.get("RESULTS_RETENTION", DEFAULT_RETENTION)
        if (
            keep is not None
            and not isinstance(keep, dt.timedelta)
            and (isinstance(keep, bool) or not isinstance(keep, (int, float)) or not keep >= 0)
        ):
            found.append(
                checks.Error(
                    f"{where}['RESULTS_RETENTION'] must be seconds >= 0, a timedelta or None, got {keep!r}",
                    id="rws_jobs.E203",
                )
            )
        database = self.options.get("DATABASE")
        if database is not None and database not in connections.settings:
            found.append(
                checks.Error(f"{where}['DATABASE'] {database!r} is not in DATABASES", id="rws_jobs.E204")
            )

        for queue in sorted(self.queues):
            try:
                queue_name(queue)
            except (TypeError, ValueError) as exc:
                found.append(checks.Error(f"TASKS[{self.alias!r}]['QUEUES']: {exc}", id="rws_jobs.E205"))
        return found


def _check_importable(task: Task) -> Task:
    """The task as declared, which the worker and get_result find by the module path; InvalidTask
    unless that path names this task's function (a Task built by hand, or ``other = task(f)``
    beside ``@task def f``, name something else). Asked at enqueue: when ``@task`` runs, the
    name is not bound yet."""

    try:
        found = load_task(task.module_path)
    except (ImportError, TypeError) as exc:
        raise InvalidTask(f"{exc}: a worker could not find this task") from None
    if found.func is not task.func:
        raise InvalidTask(f"{task.module_path!r} names another task: a worker would run that one")
    return found


def _options(task: Task, declared: Task) -> dict[str, Any] | None:
    """The task's own options that differ from its declaration's (None when none do)."""
    if not isinstance(task, RwsTask):
        return None

    changed = {k: getattr(task, k) for k in OPTIONS if getattr(task, k) != getattr(declared, k, None)}
    return changed or None


class InvalidTaskArguments(InvalidTask, TypeError):
    """Arguments JSON cannot carry: InvalidTask, and the TypeError Django's own backends raise."""


class InvalidTaskArgumentValue(InvalidTask, ValueError):
    """An argument value JSON cannot carry (NaN, bytes that are not UTF-8): InvalidTask, and the
    ValueError Django's own backends raise."""


def arguments(args: Any, kwargs: Any) -> tuple[list[Any], dict[str, Any]]:
    """``args`` and ``kwargs`` as the worker will see them, or InvalidTask when JSON would change
    them (a set, an object, NaN, a key that is not a string)."""
    try:
        args, kwargs = normalize_json(list(args)), normalize_json(dict(kwargs))
        text = history.dumps([args, kwargs])
    except TypeError as exc:
        raise InvalidTaskArguments(f"Task arguments must be JSON serializable: {exc}") from None
    except ValueError as exc:
        raise InvalidTaskArgumentValue(f"Task arguments must be JSON serializable: {exc}") from None
    if json.loads(text) != [args, kwargs]:
        raise InvalidTask("Task arguments must survive a JSON round trip unchanged (keys must be strings).")
    return args, kwargs


def whole(priority: Any) -> Any:
    """A priority Django's range check accepts as it is stored: 1.0 and True as 1; anything else
    unchanged, for enqueue's own check to name."""
    if isinstance(priority, bool) or (isinstance(priority, float) and priority.is_integer()):
        return int(priority)
    return priority


def unique_key(task: Task, args: list[Any], kwargs: dict[str, Any]) -> str:
    """The unique key of a unique task: its queue, arguments' digest."""
    digest = hashlib.sha256(json.dumps([args, kwargs], sort_keys=True).encode()).hexdigest()
    return f"{task.queue_name}:{digest}"
