"""The worker's side of django.tasks rows: run one like Django's ImmediateBackend does; its
outcome is recorded by tasks/outcomes.py.

Registered by its path as the row runner of TASK_PREFIX at start-up (apps.py), and imported at
the first task row (queue/registry.py), so ``run.execute`` and ``outcomes.record`` hand task rows
here and a worker of ``@job`` rows only never imports this module.
"""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import iscoroutinefunction
from django.db import connections

from ..attempts.decisions import decide
from ..attempts.outcomes import CancelledByHandler, Failure, Snoozed
from ..attempts.run import Returned, run_async, watching
from ..database import clock
from ..exceptions import JobInterrupted
from ..queue import middleware
from ..queue.registry import TASK_PREFIX
from ..queue.store import Claimed, Store
from ..running.context import current_job
from . import history
from .errors import TaskNotFound
from .outcomes import (
    TaskOutcome,
    error_of,
    failure_from_text,
    framework,
    record_task,
    send_robustly,
    succeed_many,
)

logger = logging.getLogger("django_rws_jobs")


class TaskRows:
    """The row runner of ``django.tasks:`` rows (registry.RowRunner)."""

    def run(self, job: Claimed) -> TaskOutcome:
        return run_task(job)

    def record(self, store: Store, job: Claimed, outcome: Any, expired_before: int | None) -> str:
        if isinstance(outcome, str):  # recovery (a lost worker) or a runner's text: a failure
            outcome = failure_from_text(job, outcome)
        return record_task(store, job, outcome, expired_before)

    def failed(self, outcome: Any) -> bool:
        return not (isinstance(outcome, TaskOutcome) and outcome.error is None)

    def record_many(self, store: Store, pairs: list[tuple[Claimed, Any]]) -> list[str]:
        """The worker's outcomes of one completer batch: the successes in one transaction (one
        fenced DELETE per claim, one INSERT of their results), the others one by one."""
        done = [(job, o) for job, o in pairs if isinstance(o, TaskOutcome) and o.error is None]
        rest = [
            self.record(store, job, o, None)
            for job, o in pairs
            if not (isinstance(o, TaskOutcome) and o.error is None)
        ]
        return rest + succeed_many(store, done)


def run_task(job: Claimed) -> TaskOutcome:
    """Call the task with its arguments (and a TaskContext), outside any transaction.

    Once the task's function has returned, the task is done, whatever cancel lands: the thread's
    Watch (run.Watch) gets the Returned mark by plain stores right after the return, so the
    cancel watcher leaves the job alone and a JobCancelled raised just before lands in the
    building of the result, which the executor then does again (Watch.result)
    (tests/test_cancel.py::test_a_cancel_that_reaches_a_task_after_it_returned_leaves_it_successful)."""
    compat, results = framework()
    started = clock.now()
    try:
        result = results.build(_running_row(job, started), TASK_PREFIX)
    except BaseException as exc:  # noqa: BLE001  (the task cannot even be loaded: a failure)
        logger.error("task %s (%s) cannot run: %s", job.id, job.job_type, exc)
        failure = TaskNotFound(str(exc))
        failure.__cause__ = exc
        return TaskOutcome(None, started, clock.now(), error=error_of(failure))
    send_robustly(compat.task_started, result)
    task = result.task
    handlers = watching(job)
    returned = TaskReturned(job, result, started)
    try:
        func = task.func
        call_args = (
            [results.RwsTaskContext(task_result=result), *result.args] if task.takes_context else result.args
        )
        if iscoroutinefunction(func):
            call = lambda: run_async(job, func, call_args, result.kwargs, returned)  # noqa: E731
        else:
            call = lambda: func(*call_args, **result.kwargs)  # noqa: E731
        executors = middleware.chains()[1]
        value = middleware.around(executors, current_job(), call) if executors else call()
    except JobInterrupted:
        raise  # not the task's failure: the job is handed back (attempts/run.py execute)
    except BaseException as exc:  # noqa: BLE001  (every failure is the task's, as Django records it)
        return returned.failed(exc)
    returned.value = value
    if handlers is not None:
        handlers.outcome = (returned, None)
    return returned.build()


class TaskReturned(Returned):
    """A task whose function has returned ``value``; ``build`` makes its outcome: the value as
    JSON, or the failure to make it one."""

    __slots__ = ("job", "result", "started")

    def __init__(self, job: Claimed, result: Any, started: float) -> None:
        super().__init__()
        self.job, self.result, self.started = job, result, started

    def build(self) -> TaskOutcome:
        try:
            text = history.dumps(framework()[0].normalize_json(self.value))
        except Exception as exc:  # a value that is no JSON: the task's failure, as Django records it
            return self.failed(exc)
        object.__setattr__(self.result, "_return_value", history.load_value(text))
        return TaskOutcome(self.result, self.started, clock.now(), value=text)

    def failed(self, exc: BaseException) -> TaskOutcome:
        result = self.result
        # What the task decided by raising (Snooze, Retry, Fail, Cancel) or its fail_on and
        # backoff decide (attempts/decisions.py); None for a plain failure on the backoff.
        decision = decide(exc, result.task, self.job) if isinstance(exc, Exception) else None
        if not isinstance(decision, (Snoozed, Failure, CancelledByHandler)):
            decision = None
        if not isinstance(decision, Snoozed):
            logger.error(
                "task %s (%s) failed on attempt %d",
                self.job.id,
                result.task.module_path,
                result.attempts,
                exc_info=exc,
            )
        outcome = TaskOutcome(
            result, self.started, clock.now(), error=error_of(exc), exc=exc, decision=decision
        )
        object.__setattr__(result, "status", framework()[0].TaskResultStatus.FAILED)
        return outcome


def _running_row(job: Claimed, started: float) -> tuple[Any, ...]:
    """The result row of a claimed task as get_result would read it (results.RESULT_SQL). The
    history is read only for a retried task: a first attempt has none."""
    past = _stored_history(job) if job.attempts else None
    return (
        job.id,
        job.job_type,
        job.payload,
        "running",
        job.queue,
        job.priority,
        started,
        job.token,
        past,
        None,
        None,
        None,  # the metadata: the task reads it through its context (current_job())
    )


def _stored_history(job: Claimed) -> str | None:
    payload = history.load(job.payload)
    alias = framework()[0].task_backends[payload.get("backend", "default")].database
    with connections[alias].cursor() as c:
        c.execute("SELECT task_history FROM rws_jobs WHERE id = %s", [job.id])
        row = c.fetchone()
    return None if row is None else row[0]
