"""Read a task's result: its job row while it waits, runs or failed, its result row once it
succeeded, in one query (tests/test_tasks_backend.py)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from django.db import connections
from django.utils.module_loading import import_string

from ..exceptions import JobCancelled
from ..running.context import current_job
from . import history
from .compat import (
    InvalidTask,
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
)

#: RwsTask's own options a payload may carry (tasks/backend.py _options).
OPTIONS = ("max_attempts", "unique", "timeout")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RwsTaskResult(TaskResult):
    """Django's TaskResult, with the task's ``metadata``: as enqueued (``task.using(metadata=)``),
    as the task saved it while it ran, and as it was when it succeeded (kept in its result row)."""

    metadata: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RwsTaskContext(TaskContext):
    """The TaskContext a task with ``takes_context`` gets: Django's, with the names of Django's
    metadata proposal: ``metadata`` (the job's, a dict the task may change), ``save_metadata()``
    and ``asave_metadata()`` (see JobContext.save_metadata)."""

    @property
    def metadata(self) -> dict[str, Any]:
        return _running().metadata

    def save_metadata(self) -> bool:
        return _running().save_metadata()

    async def asave_metadata(self) -> bool:
        return bool(await _running().asave_metadata())


def _running() -> Any:

    job = current_job()
    if job is None:
        raise RuntimeError("the task's metadata is read and saved only while the task runs")
    return job


#: rws_jobs' status -> the task's.
STATUSES = {
    "pending": TaskResultStatus.READY,
    "running": TaskResultStatus.RUNNING,
    "failed": TaskResultStatus.FAILED,
    "waiting": TaskResultStatus.READY,  # its concurrency key at its limit
    "cancelled": TaskResultStatus.FAILED,  # with a JobCancelled error (rows.py)
}

#: A task's job row, or its result row: the same columns, in this order.
RESULT_SQL = (
    "SELECT id, job_type, payload, status, queue, priority, started_at, locked_by, task_history, "
    "NULL, COALESCE(failed_at, cancelled_at), metadata FROM rws_jobs WHERE id = %s "
    "UNION ALL "
    "SELECT id, task_path, payload, 'successful', queue, priority, NULL, NULL, history, return_value, "
    "finished_at, metadata FROM rws_task_results WHERE id = %s"
)


@functools.lru_cache(maxsize=1024)
def load_task(path: str) -> Task:
    """The ``Task`` object a task row names by its module path; anything else is refused. Found
    once per path (a refusal is not kept: a later deploy may bring the task)."""
    try:
        found = import_string(path)
    except ImportError as exc:
        raise ImportError(f"task {path!r} cannot be imported: {exc}") from exc
    if not isinstance(found, Task):
        raise TypeError(f"{path!r} is {type(found).__name__}, not a task (decorate it with @task)")
    return found


def fetch(alias: str, result_id: Any, prefix: str, backend: str) -> TaskResult:
    """The TaskResult of ``result_id`` enqueued through the backend named ``backend``;
    TaskResultDoesNotExist for an unknown or malformed id, a job row that is not a task's, or a
    task of another backend on the same database, as django-tasks-db's backend filters on its
    name (tests/test_tasks_backend.py::test_get_result_finds_only_its_own_backends_tasks)."""
    if not isinstance(result_id, str) or not 0 < len(result_id) <= 64 or "\x00" in result_id:
        raise TaskResultDoesNotExist(result_id)
    with connections[alias].cursor() as c:
        c.execute(RESULT_SQL, [result_id, result_id])
        rows = [r for r in c.fetchall() if r[0] == result_id]  # exact, whatever the collation
    if not rows or (rows[0][3] != "successful" and not rows[0][1].startswith(prefix)):
        raise TaskResultDoesNotExist(result_id)
    result = build(rows[0], prefix)
    if result.backend != backend:
        raise TaskResultDoesNotExist(result_id)
    return result


def build(row: tuple[Any, ...], prefix: str) -> TaskResult:
    """A TaskResult from RESULT_SQL's row."""
    (
        result_id,
        path,
        payload_text,
        status,
        queue,
        priority,
        started,
        token,
        history_text,
        value,
        ended,
        meta,
    ) = row
    if path.startswith(prefix):
        path = path[len(prefix) :]
    payload = history.load(payload_text)
    past = history.load(history_text)
    try:
        task = load_task(path)
    except (ImportError, TypeError) as exc:
        raise TaskResultDoesNotExist(f"{result_id}: {exc}") from exc
    task = _as_enqueued(task, payload, queue, priority)
    state = TaskResultStatus.SUCCESSFUL if status == "successful" else STATUSES[status]
    enqueued = float(payload.get("enqueued_at") or 0)
    started_at, attempted, finished, worker_ids = _attempts(state, past, enqueued, started, token, ended)
    result = RwsTaskResult(
        metadata=history.load(meta) if isinstance(meta, str) else meta,
        task=task,
        id=result_id,
        status=state,
        enqueued_at=history.when(enqueued),
        started_at=history.when(started_at),
        finished_at=history.when(finished),
        last_attempted_at=history.when(attempted),
        args=payload.get("args", []),
        kwargs=payload.get("kwargs", {}),
        backend=payload.get("backend", task.backend),
        errors=[TaskError(**e) for e in past.get("errors") or []] + _cancelled(status),
        worker_ids=worker_ids,
    )
    if state == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", history.load_value(value))
    return result


def _cancelled(status: str) -> list[TaskError]:
    """A cancelled task's last error: JobCancelled (cancellation.py)."""
    if status != "cancelled":
        return []
    name = f"{JobCancelled.__module__}.{JobCancelled.__qualname__}"
    return [TaskError(exception_class_path=name, traceback=f"{name}: the task was cancelled\n")]


def _as_enqueued(task: Task, payload: dict[str, Any], queue: str, priority: Any) -> Task:
    """``task`` as it was enqueued, with .using()'s changes (replace validates the task again)."""
    run_after = payload.get("run_after")
    backend = payload.get("backend", task.backend)
    options = payload.get("options")
    if isinstance(options, dict) and options:  # with_options' changes (tasks/backend.py _options)
        known = {k: v for k, v in options.items() if k in OPTIONS and hasattr(task, k)}
        try:
            task = dataclasses.replace(task, **known)
        except (TypeError, ValueError, InvalidTask):  # a value refused now: the task as declared
            pass
    if (
        run_after is not None
        or task.queue_name != queue
        or task.priority != priority
        or task.backend != backend
        or task.run_after is not None
    ):
        return dataclasses.replace(
            task,
            queue_name=queue,
            priority=int(priority),
            backend=backend,
            run_after=None if run_after is None else _parse(run_after),
        )
    return task


def _attempts(
    state: TaskResultStatus, past: dict[str, Any], enqueued: float, started: Any, token: Any, ended: Any
) -> tuple[Any, Any, Any, list[str]]:
    """(started_at, last_attempted_at, finished_at, worker_ids) of a task in ``state``, times in unix
    seconds: from its history ``past``, the claim of a running task (``started``, ``token``) and the
    row's last time (``ended``: failed_at or finished_at)."""
    worker_ids = list(past.get("worker_ids") or [])
    started_at = past.get("started_at")
    attempted = past.get("last_attempted_at")
    finished = (
        past.get("finished_at") if state in (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED) else None
    )
    if state == TaskResultStatus.RUNNING:
        # The running attempt is in the claim, not yet in the history (a claim writes none).
        attempted = max(float(started or 0), enqueued)
        started_at = started_at or attempted
        worker = history.worker_of(token)
        if worker is not None:
            worker_ids.append(worker)
    if finished is None and state == TaskResultStatus.FAILED and ended is not None:
        finished = max(float(ended), float(attempted or 0))
    return started_at, attempted, finished, worker_ids


def _parse(text: str) -> Any:
    import datetime as dt

    return dt.datetime.fromisoformat(text)
