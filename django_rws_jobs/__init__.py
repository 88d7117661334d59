"""django-rws-jobs: a persistent job queue in your Django database.

The public API. Functions import their modules on call, so this package can be imported before
Django's app registry is ready (in a ``jobs.py`` or a settings-time import). Each wrapper has the
signature of the function it calls (tests/test_registry.py::test_public_functions_have_real_signatures).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .exceptions import Cancel, Fail, JobCancelled, JobInterrupted, JobTimeout, Retry, Snooze
from .queue.progress import Progress
from .queue.registry import job, register
from .running.context import JobContext, current_job

if TYPE_CHECKING:
    from .api.batches import Batch, Call
    from .api.batches import batch as OpenBatch
    from .models import Job, Worker
    from .schedules.declared import Schedule

__all__ = [
    "job",
    "register",
    "enqueue",
    "enqueue_many",
    "jobs",
    "failed_jobs",
    "retry",
    "delete",
    "tick",
    "tick_schedules",
    "pause_queue",
    "resume_queue",
    "paused_queues",
    "workers",
    "cancel",
    "batch",
    "call",
    "get_batch",
    "chain",
    "current_job",
    "get_progress",
    "JobContext",
    "Progress",
    "JobTimeout",
    "JobCancelled",
    "JobInterrupted",
    "Snooze",
    "Retry",
    "Fail",
    "Cancel",
]


def enqueue(
    job_type: str,
    payload: str = "",
    *,
    queue: str | None = None,
    priority: int | None = None,
    run_at: dt.datetime | None = None,
    run_in: dt.timedelta | float | None = None,
    unique: str | None = None,
    max_retries: int | None = None,
    timeout: float | None = None,
    concurrency_key: str | None = None,
    after: list[Any] | None = None,
    on_dependency_failure: str = "cancel",
    metadata: dict[str, Any] | None = None,
    using: str | None = None,
    on_conflict: str = "skip",
    max_delay: dt.timedelta | float | None = None,
    unique_for: dt.timedelta | float | None = None,
) -> str:
    """Store a job and return its id; inside ``transaction.atomic()`` it commits with the caller.

    With ``unique=key``, while a job of this type and key is pending or running nothing is
    inserted and that job's id is returned; ``on_conflict="replace"`` makes a waiting holder take
    this call's payload, due time and options instead (``max_delay``: seconds after its burst's
    first enqueue by which it is due however often it is replaced), and ``unique_for`` keeps the
    key taken for that many seconds from the enqueue that took it (a throttle). The id is a
    ``str`` whose ``outcome`` is "stored", "skipped" or "replaced". ``timeout``: this job's time
    limit in seconds. With ``concurrency_key``, at most the type's ``concurrency_limit`` (1 unless
    set) jobs with that key run at once, across every worker. With ``after=[job ids and
    batches]``, the job waits (blocked) until each has succeeded; ``on_dependency_failure``:
    "cancel", "run" or "wait". ``metadata``: a dict (JSON) the job carries: ``Job.metadata``,
    ``current_job().metadata``.
    """
    from .api.enqueue import enqueue as _enqueue  # (loads the models)

    # CPython compiles a call with more than 14 keywords into one that builds a dict of them
    # first (its STACK_USE_GUIDELINE), which costs more than the rest of this wrapper: the options
    # of api/enqueue_once.py go along only when given (benchmarks/enqueue_once.py --instructions).
    if on_conflict == "skip" and max_delay is None and unique_for is None:
        return _enqueue(
            job_type,
            payload,
            queue=queue,
            priority=priority,
            run_at=run_at,
            run_in=run_in,
            unique=unique,
            max_retries=max_retries,
            timeout=timeout,
            concurrency_key=concurrency_key,
            after=after,
            on_dependency_failure=on_dependency_failure,
            metadata=metadata,
            using=using,
        )
    return _enqueue(
        job_type,
        payload,
        queue=queue,
        priority=priority,
        run_at=run_at,
        run_in=run_in,
        unique=unique,
        max_retries=max_retries,
        timeout=timeout,
        concurrency_key=concurrency_key,
        after=after,
        on_dependency_failure=on_dependency_failure,
        metadata=metadata,
        using=using,
        on_conflict=on_conflict,
        max_delay=max_delay,
        unique_for=unique_for,
    )


def enqueue_many(jobs: Iterable[Any], *, using: str | None = None, batch_size: int = 1000) -> list[str]:
    """Store many jobs in one go (items: job_type, (job_type, payload) or a dict of enqueue's arguments)."""
    from .api.enqueue_many import enqueue_many as _enqueue_many  # (loads the models)

    return _enqueue_many(jobs, using=using, batch_size=batch_size)


def jobs(status: str | None = None, limit: int = 100, *, using: str | None = None) -> list[Job]:
    """Jobs with ``status`` (all when None), highest priority and earliest due first, at most ``limit``."""
    from .api.enqueue import jobs as _jobs  # (loads the models)

    return _jobs(status, limit, using=using)


def failed_jobs(limit: int = 100, *, using: str | None = None) -> list[Job]:
    """The dead-letter list: jobs that exhausted their retries."""
    from .api.enqueue import failed_jobs as _failed  # (loads the models)

    return _failed(limit, using=using)


def retry(
    job_id: str,
    *,
    using: str | None = None,
    now: int | None = None,
    payload: str | None = None,
    restart: bool = False,
) -> bool:
    """Put a failed job back in the queue, due now (or at ``now``), attempts reset; with
    ``payload``, that payload instead of its own. A long job resumes from its checkpoint;
    ``restart=True`` clears it, so the job starts from the beginning."""
    from .api.dead_letters import retry as _retry  # (loads the models)

    return _retry(job_id, using=using, now=now, payload=payload, restart=restart)


def delete(job_id: str, *, using: str | None = None) -> bool:
    """Delete a job that is not running."""
    from .api.dead_letters import delete as _delete  # (loads the models)

    return _delete(job_id, using=using)


def tick(*, queues: list[str] | None = None, using: str | None = None) -> bool:
    """Claim and run one due job in the calling thread; False when none is due."""
    from .worker.tick import tick as _tick  # (loads the models)

    return _tick(queues=queues, using=using)


def tick_schedules(
    now: int | None = None, *, using: str | None = None, schedules: list[Schedule] | None = None
) -> int:
    """Enqueue the cron jobs that are due, each due time once across all processes."""
    from .schedules.ticks import tick_schedules as _tick_schedules  # (loads the models)

    return _tick_schedules(now, using=using, schedules=schedules)


def pause_queue(name: str, *, using: str | None = None) -> None:
    """Stop every worker from claiming jobs of queue ``name`` until ``resume_queue(name)``."""
    from .flow.pauses import pause_queue as _pause  # (loads the models)

    _pause(name, using=using)


def resume_queue(name: str, *, using: str | None = None) -> None:
    """Let workers claim jobs of queue ``name`` again; idle workers are woken."""
    from .flow.pauses import resume_queue as _resume  # (loads the models)

    _resume(name, using=using)


def paused_queues(*, using: str | None = None) -> list[str]:
    """The names of the paused queues, in name order."""
    from .flow.pauses import paused_queues as _paused  # (loads the models)

    return _paused(using=using)


def workers(*, using: str | None = None) -> list[Worker]:
    """The live workers: each running ``rws_worker`` process whose heartbeat is at most three
    intervals old, with its host, pid, queues, the jobs it holds and its counts."""
    from .operations.worker_rows import workers as _workers  # (loads the models)

    return _workers(using=using)


def cancel(job_id: str, *, by: str | None = None, using: str | None = None) -> bool:
    """Cancel a pending, waiting or running job; False when no such job has that id. A running
    job's worker stops its handler within about a second; a cancelled job is never retried.
    ``by``: who asked, kept on the row."""
    from .api.cancellation import cancel as _cancel  # (loads the models)

    return _cancel(job_id, by=by, using=using)


def batch(
    *,
    on_success: Call | list[Call] | None = None,
    on_failure: Call | list[Call] | None = None,
    on_finish: Call | list[Call] | None = None,
    description: str = "",
    metadata: dict[str, Any] | None = None,
    fail_fast: bool = False,
    using: str | None = None,
) -> OpenBatch:
    """``with batch(on_success=call(...)) as b:``: every job enqueued in the block is a member;
    leaving the block seals the batch, an exception in it cancels the batch. Once every member
    has ended, ``on_finish`` is enqueued, and ``on_success`` if all succeeded, else
    ``on_failure``: each once per finish, whatever crashes. ``fail_fast``: the first member that
    dies cancels the rest. ``b.id`` is its id."""
    from .api.batches import batch as _batch  # (loads the models)

    return _batch(
        on_success=on_success,
        on_failure=on_failure,
        on_finish=on_finish,
        description=description,
        metadata=metadata,
        fail_fast=fail_fast,
        using=using,
    )


def call(target: Any, *args: Any, **options: Any) -> Call:
    """A batch's callback: a job_type, its payload and enqueue options
    (``call("reports.build", "7", queue="reports")``), or a django.tasks task and its arguments
    (``call(build_report, import_id=7)``)."""
    from .api.batches import call as _call  # (loads the models)

    return _call(target, *args, **options)


def chain(*steps: Any, on_dependency_failure: str = "cancel", using: str | None = None) -> list[str]:
    """Enqueue jobs that run one step after another, in one transaction: each step a
    ``call(...)`` or a list of them run side by side (``chain(call("a"), [call("b"),
    call("c")], call("d"))``); a step that fails cancels the rest. The ids, in order."""
    from .api.chains import chain as _chain  # (loads the models)

    return _chain(*steps, on_dependency_failure=on_dependency_failure, using=using)


def get_batch(batch_id: str, *, using: str | None = None) -> Batch | None:
    """The batch ``batch_id`` with its state and counts, or None."""
    from .api.batches import get_batch as _get_batch  # (loads the models)

    return _get_batch(batch_id, using=using)


def get_progress(job_id: str, *, using: str | None = None) -> Progress | None:
    """The progress the job's handler last reported (``current_job().progress(...)``), or None
    if it reported none or the job is gone (a job that succeeded is deleted)."""
    from .running.reports import get_progress as _get_progress  # (loads the models)

    return _get_progress(job_id, using=using)
