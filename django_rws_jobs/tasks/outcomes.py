"""Record a task attempt's outcome, fenced on the claim, and send the signals once it is
committed: success deletes the job row and writes the result in one transaction; a failure
retries or moves the row to the dead-letter list, with its error in the history."""

from __future__ import annotations

import dataclasses
import functools
import logging
import traceback
from typing import Any

from asgiref.sync import async_to_sync
from django.db import transaction

from ..attempts.outcomes import (
    ERROR_MAX,
    TRACEBACK_MAX,
    CancelledByHandler,
    Failure,
    Snoozed,
    record_cancel,
    record_snooze,
    retry_at,
    send_dead,
    storable,
)
from ..database import clock
from ..database.backends.base import is_registered
from ..exceptions import TIMED_OUT, JobTimeout
from ..queue.registry import TASK_PREFIX
from ..queue.store import BACK_IN_QUEUE, Claimed, Store
from . import compat, history, results
from .errors import WorkerLost

logger = logging.getLogger("django_rws_jobs")


@functools.cache
def framework() -> tuple[Any, Any]:
    """The ``compat`` and ``results`` modules, imported at the first task row (as this module
    is): a worker of ``@job`` rows only never imports them. A cached call costs a fraction of a
    relative import inside a function, which runs at every call."""

    return compat, results


@dataclasses.dataclass
class TaskOutcome:
    """One attempt's end: ``value`` (JSON) when it succeeded, else ``error`` (TaskError's fields)."""

    result: Any  # the TaskResult as the attempt left it (None: the task could not be loaded)
    started: float | None
    finished: float
    value: str | None = None
    error: dict[str, str] | None = None
    exc: BaseException | None = None  # what the task raised, for task_finished's receivers' exc_info
    #: What the task decided by raising Snooze, Retry, Fail or Cancel, or its type's fail_on and
    #: backoff decided (attempts/decisions.py): a Snoozed, Failure or CancelledByHandler.
    decision: str | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without ``exc`` (a process pool's child sends outcomes to the worker): not
        every exception can be rebuilt from its pickle."""
        return {**self.__dict__, "exc": None}


def error_of(exc: BaseException) -> dict[str, str]:
    kind = type(exc)
    return {
        "exception_class_path": f"{kind.__module__}.{kind.__qualname__}",
        "traceback": "".join(traceback.format_exception(kind, exc, exc.__traceback__)),
    }


def failure_from_text(job: Claimed, text: str) -> TaskOutcome:
    """The outcome of a failure the worker recorded as text, not the task: JobTimeout when the
    attempt ran past its limit, else WorkerLost (recovery, a child process that died). Pinned by
    tests/test_tasks_worker.py::test_a_task_past_its_timeout_fails_with_job_timeout."""
    kind: type[BaseException] = JobTimeout if text.startswith(TIMED_OUT) else WorkerLost
    name = f"{kind.__module__}.{kind.__qualname__}"
    message = text.removeprefix(TIMED_OUT)
    error = {"exception_class_path": name, "traceback": f"{name}: {message}\n"}
    return TaskOutcome(None, None, clock.now(), error=error)


def record_task(store: Store, job: Claimed, outcome: TaskOutcome, expired_before: int | None) -> str:
    """Write the attempt's outcome, fenced on the claim; signal the final one once committed. A
    snooze is no attempt: no history, no signal; a Cancel ends the row as an operator's cancel
    does (tests/test_outcomes.py::test_each_decision_in_a_task)."""
    decision = outcome.decision
    if isinstance(decision, Snoozed):
        if record_snooze(store, job, decision, expired_before):
            return "snoozed"
        decision = None  # the claim is gone, or a cancel was requested: as any failure below
    if isinstance(decision, CancelledByHandler):
        tb = storable(outcome.error["traceback"], TRACEBACK_MAX, keep_end=True) if outcome.error else None
        if record_cancel(store, job, decision, tb, expired_before):
            return "cancelled"
        decision = None
    if outcome.result is None:  # recovery, or a task that could not be loaded: the stored history
        past = history.load(_history_text(store, job))
        after = history.after_attempt(
            past, history.worker_of(job.token), None, outcome.finished, outcome.error
        )
    else:
        after = _after(job, outcome)
    if outcome.error is None:
        applied, what = _succeed(store, job, outcome, after), "done"
    else:
        decided = decision if isinstance(decision, Failure) else None
        applied, what = _fail(store, job, outcome, after, expired_before, decided)
    if not applied and what != "done" and record_cancel(store, job, None, None, expired_before):
        return "cancelled"  # it failed after a cancel was requested: not retried
    if not applied:
        logger.warning(
            "task %s (%s): result %r dropped: claim %s no longer holds it",
            job.id,
            job.job_type,
            what,
            job.token,
        )
        return "lost"
    if what in ("done", "dead"):
        _after_commit(store, lambda: finished(job, after, outcome))
    return what


def _history_text(store: Store, job: Claimed) -> str | None:
    with store.cursor() as c:
        c.execute("SELECT task_history FROM rws_jobs WHERE id = %s", [job.id])
        row = c.fetchone()
    return None if row is None else row[0]


def _succeed(store: Store, job: Claimed, outcome: TaskOutcome, after: dict[str, Any]) -> bool:
    """Delete the job row and write its result in one transaction: a result exists exactly when
    the fenced deletion applied (tests/test_tasks_worker.py::test_a_late_result_writes_nothing)."""
    with store.writes, store.atomic(), store.cursor() as c:
        if store.features.can_return_deleted:  # with the batch, the dependents' flag, the metadata
            found = store.backend.delete_finished(store, c, job.token, [job.id], metadata=True)
            if not found:
                return False
            job.batch_id, job.has_dependents, metadata = found[0][1], found[0][2], found[0][3]
        else:  # (MySQL: the sweeps settle its batch and dependents)
            metadata = _metadata(c, [job.id]).get(job.id)
            c.execute(
                "DELETE FROM rws_jobs WHERE id = %s AND status = 'running' AND locked_by = %s",
                [job.id, job.token],
            )
            if c.rowcount != 1:
                return False
        c.execute(f"{RESULT_INSERT} {RESULT_ROW}", _result_values(job, outcome, after, metadata))
    return True


def succeed_many(store: Store, pairs: list[tuple[Claimed, TaskOutcome]]) -> list[str]:
    """Delete the job rows of succeeded tasks and write their results in one transaction; what a
    claim no longer holds writes neither (as _succeed, for many)."""
    if not pairs:
        return []
    if not store.features.can_return_deleted:  # MySQL: its deletion runs a transaction of its own
        return [record_task(store, job, o, None) for job, o in pairs]
    rows = {job.id: (job, o, _after(job, o)) for job, o in pairs}
    by_token: dict[str, list[str]] = {}
    for job, _o in pairs:
        by_token.setdefault(job.token, []).append(job.id)
    with store.writes, store.atomic(), store.cursor() as c:
        found = [
            row
            for token, ids in by_token.items()
            for row in store.backend.delete_finished(store, c, token, ids, metadata=True)
        ]
        deleted = [row[0] for row in found]
        metadata = {}
        for job_id, batch_id, has_dependents, meta in found:  # for the batches' and dependents' bookkeeping
            rows[job_id][0].batch_id, rows[job_id][0].has_dependents = batch_id, has_dependents
            metadata[job_id] = meta
        if deleted:
            values = [_result_values(*rows[i], metadata[i]) for i in deleted]
            sql = f"{RESULT_INSERT} {', '.join([RESULT_ROW] * len(values))}"
            c.execute(sql, [v for row in values for v in row])
    gone = set(deleted)
    for job_id in deleted:
        job, outcome, after = rows[job_id]
        _after_commit(store, lambda job=job, after=after, outcome=outcome: finished(job, after, outcome))
    for job, _o in pairs:
        if job.id not in gone:
            logger.warning(
                "task %s (%s): result 'done' dropped: claim %s no longer holds it",
                job.id,
                job.job_type,
                job.token,
            )
    return ["done" if job.id in gone else "lost" for job, _o in pairs]


RESULT_INSERT = (
    "INSERT INTO rws_task_results (id, task_path, queue, priority, payload, return_value, history, "
    "finished_at, metadata) VALUES"
)
RESULT_ROW = "(%s, %s, %s, %s, %s, %s, %s, %s, %s)"


def _metadata(c: Any, ids: list[str]) -> dict[str, Any]:
    """The metadata of the jobs ``ids`` that have any, read before their rows are deleted where
    the deletion cannot return it (MySQL): a task's result keeps it
    (tests/test_reports.py::test_a_tasks_result_keeps_its_metadata)."""
    c.execute(
        f"SELECT id, metadata FROM rws_jobs WHERE id IN ({', '.join(['%s'] * len(ids))}) "
        "AND metadata IS NOT NULL",
        ids,
    )
    return dict(c.fetchall())


def _after(job: Claimed, outcome: TaskOutcome) -> dict[str, Any]:
    """The history once this attempt is over (see history.after_attempt)."""
    result = outcome.result
    past: dict[str, Any] = {}
    if result is not None:
        past = {
            "errors": [dataclasses.asdict(e) for e in result.errors],
            "worker_ids": result.worker_ids[:-1],
            "started_at": result.started_at.timestamp() if result.started_at else None,
        }
    return history.after_attempt(
        past, history.worker_of(job.token), outcome.started, outcome.finished, outcome.error
    )


def _result_values(
    job: Claimed, outcome: TaskOutcome, after: dict[str, Any], metadata: Any = None
) -> list[Any]:
    return [
        job.id,
        job.job_type[len(TASK_PREFIX) :],
        job.queue,
        job.priority,
        job.payload,
        outcome.value,
        history.dumps(after),
        int(outcome.finished),
        metadata,
    ]


def _fail(
    store: Store,
    job: Claimed,
    outcome: TaskOutcome,
    after: dict[str, Any],
    expired_before: int | None,
    decided: Failure | None = None,
) -> tuple[bool, str]:
    """Back to pending with a backoff (or the delay the task or its type ``decided``) while
    attempts are left, else (or when it ``decided`` so: Fail, fail_on) to the dead-letter list."""
    assert outcome.error is not None
    attempts = job.attempts + 1
    last_error = storable(outcome.error["traceback"].rstrip().rsplit("\n", 1)[-1], ERROR_MAX)
    tb = storable(outcome.error["traceback"], TRACEBACK_MAX, keep_end=True)
    text = history.dumps(after)
    if attempts <= job.max_retries and not (decided is not None and decided.dead):
        due = retry_at(attempts, outcome.finished, None if decided is None else decided.delay)
        sql = (
            f"UPDATE rws_jobs SET {BACK_IN_QUEUE}, attempts = %s, last_error = %s, traceback = %s, "
            "next_run_at = %s, task_history = %s, locked_by = NULL, locked_until = NULL"
        )
        applied = store.fenced(sql, [attempts, last_error, tb, due, text], job, expired_before, False)
        return applied, "retry"
    now = int(outcome.finished)
    sql = (
        "UPDATE rws_jobs SET status = 'failed', attempts = %s, last_error = %s, traceback = %s, "
        "failed_at = %s, task_history = %s, unique_hash = NULL, concurrency_slot = NULL, locked_by = NULL, "
        "locked_until = NULL"
    )
    applied = store.fenced(sql, [attempts, last_error, tb, now, text], job, expired_before, False)
    if applied:
        dead = job.as_job(
            status="failed", attempts=attempts, last_error=last_error, traceback=tb, failed_at=now
        )
        _after_commit(store, lambda: send_dead(dead))
    return applied, "dead"


def _after_commit(store: Store, fn: Any) -> None:
    """Run ``fn`` once the outcome is committed: at once on the worker's own connection, at the
    commit of the caller's transaction for ``tick()`` inside one."""
    if is_registered(store.conn):
        transaction.on_commit(fn, using=store.conn.alias)
    else:
        fn()


def finished(job: Claimed, after: dict[str, Any], outcome: TaskOutcome) -> None:
    """Send task_finished for the final outcome, with the result as get_result reads it: the
    attempt's own TaskResult brought to its end (as ImmediateBackend does), else one read from
    the row as written (recovery's outcome)."""
    compat = framework()[0]
    result = outcome.result
    if result is not None:
        if outcome.error is not None:
            result.errors.append(compat.TaskError(**outcome.error))
        status = (
            compat.TaskResultStatus.SUCCESSFUL if outcome.error is None else compat.TaskResultStatus.FAILED
        )
        object.__setattr__(result, "status", status)
        object.__setattr__(result, "finished_at", history.when(outcome.finished))
    else:
        result = _read_back(job, after, outcome)
        if result is None:
            return
    if outcome.exc is None:
        send_robustly(compat.task_finished, result)
        return
    # Sent while handling what the task raised, as ImmediateBackend sends it: Django's own
    # receiver logs the FAILED task with its traceback (sys.exc_info()).
    try:
        raise outcome.exc
    except BaseException:  # noqa: BLE001
        send_robustly(compat.task_finished, result)


def _read_back(job: Claimed, after: dict[str, Any], outcome: TaskOutcome) -> Any:
    build = framework()[1].build
    status = "successful" if outcome.error is None else "failed"
    row = (job.id, job.job_type, job.payload, status, job.queue, job.priority, None, None)
    try:
        return build((*row, history.dumps(after), outcome.value, int(outcome.finished)), TASK_PREFIX)
    except Exception:  # noqa: BLE001  (a task that cannot be loaded has no TaskResult to send)
        logger.warning(
            "task %s (%s): task_finished not sent: the task cannot be loaded", job.id, job.job_type
        )
        return None


def send_robustly(signal: Any, result: Any) -> None:
    """Send ``signal`` to each receiver in turn; whatever one raises (even SystemExit) is logged
    and stops neither the others nor the worker's thread."""
    sender = type(framework()[0].task_backends[result.backend])
    sync_receivers, async_receivers = signal._live_receivers(sender)
    for receiver in [*sync_receivers, *(async_to_sync(r) for r in async_receivers)]:
        try:
            receiver(signal=signal, sender=sender, task_result=result)
        except BaseException:  # noqa: BLE001
            logger.exception("%r receiver raised for task %s", receiver, result.id)
