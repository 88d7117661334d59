"""django-rws-jobs: a persistent job queue in your Django database.

The public API. Functions import their modules on call, so this package can be imported before
Django's app registry is ready (in a ``jobs.py`` or a settings-time import).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .registry import job, register

if TYPE_CHECKING:
    from .models import Job

__all__ = ["job", "register", "enqueue", "enqueue_many", "jobs", "failed_jobs", "retry", "delete", "tick", "tick_schedules"]


def enqueue(job_type: str, payload: str = "", **options: Any) -> str:
    """Store a job and return its id (options: queue, priority, run_at, run_in, unique, max_retries, using)."""
    from .api import enqueue as _enqueue

    return _enqueue(job_type, payload, **options)


def enqueue_many(jobs: Any, **options: Any) -> list[str]:
    """Store many jobs in one go (items: job_type, (job_type, payload) or a dict of enqueue's arguments)."""
    from .api import enqueue_many as _enqueue_many

    return _enqueue_many(jobs, **options)


def jobs(status: str | None = None, limit: int = 100, **options: Any) -> list[Job]:
    """Jobs with ``status`` (all when None), highest priority and earliest due first, at most ``limit``."""
    from .api import jobs as _jobs

    return _jobs(status, limit, **options)


def failed_jobs(limit: int = 100, **options: Any) -> list[Job]:
    """The dead-letter list: jobs that exhausted their retries."""
    from .api import failed_jobs as _failed

    return _failed(limit, **options)


def retry(job_id: str, **options: Any) -> bool:
    """Put a failed job back in the queue, due now, attempts reset."""
    from .api import retry as _retry

    return _retry(job_id, **options)


def delete(job_id: str, **options: Any) -> bool:
    """Delete a job that is not running."""
    from .api import delete as _delete

    return _delete(job_id, **options)


def tick(**options: Any) -> bool:
    """Claim and run one due job in the calling thread; False when none is due."""
    from .api import tick as _tick

    return _tick(**options)


def tick_schedules(now: int | None = None, **options: Any) -> int:
    """Enqueue the cron jobs that are due, each due time once across all processes."""
    from .schedules import tick_schedules as _tick_schedules

    return _tick_schedules(now, **options)
