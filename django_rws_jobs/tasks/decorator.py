"""``@task`` with this backend's options: Django's decorator, then ``with_options``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .backend import RwsJobsBackend
from .compat import task_backends


def task(
    function: Callable[..., Any] | None = None,
    *,
    max_attempts: int | None = None,
    unique: bool = False,
    timeout: float | None = None,
    concurrency_key: str | Callable[..., str] | None = None,
    concurrency_limit: int | None = None,
    backoff: Any = None,
    fail_on: Any = None,
    unique_for: Any = None,
    **options: Any,
) -> Any:
    """Django's ``@task`` (``priority``, ``queue_name``, ``backend``, ``takes_context``) plus
    ``max_attempts``, ``unique``, ``timeout``, ``concurrency_key``, ``concurrency_limit``,
    ``backoff``, ``fail_on`` and ``unique_for`` (see RwsTask); the backend must be an
    RwsJobsBackend."""

    try:
        from django.tasks import task as django_task
    except ImportError:  # Django 5.2: the backport
        from django_tasks import task as django_task  # type: ignore[no-redef,unused-ignore]

    def wrap(func: Callable[..., Any]) -> Any:
        backend = task_backends[options.get("backend", "default")]
        if not isinstance(backend, RwsJobsBackend):
            raise TypeError(
                "max_attempts, unique, timeout and the concurrency options need an RwsJobsBackend; "
                f"TASKS[{backend.alias!r}] is {type(backend).__name__}"
            )
        return django_task(func, **options).with_options(
            max_attempts=max_attempts,
            unique=unique,
            timeout=timeout,
            concurrency_key=concurrency_key,
            concurrency_limit=concurrency_limit,
            backoff=backoff,
            fail_on=fail_on,
            unique_for=unique_for,
        )

    return wrap(function) if function is not None else wrap
