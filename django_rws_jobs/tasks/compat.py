"""``django.tasks`` on Django 6, the ``django-tasks`` backport on Django 5.2: one set of names.

Imported only by the modules that need the framework, never by the worker's hot path or at
Django's set-up, so a project without either runs ``@job`` handlers as before.
"""

from __future__ import annotations

try:
    from django.tasks import task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import (
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        Task,
        TaskContext,
        TaskError,
        TaskResult,
        TaskResultStatus,
    )
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json
except ImportError:  # Django 5.2: the backport (pip install "django-rws-jobs[tasks]")
    from django_tasks import task_backends  # type: ignore[no-redef,unused-ignore]
    from django_tasks.backends.base import BaseTaskBackend  # type: ignore[no-redef,unused-ignore]
    from django_tasks.base import (  # type: ignore[no-redef,unused-ignore]
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        Task,
        TaskContext,
        TaskError,
        TaskResult,
        TaskResultStatus,
    )
    from django_tasks.exceptions import InvalidTaskError as InvalidTask  # type: ignore[no-redef,unused-ignore]
    from django_tasks.exceptions import TaskResultDoesNotExist  # type: ignore[no-redef,unused-ignore]
    from django_tasks.signals import task_enqueued, task_finished, task_started  # type: ignore[no-redef,unused-ignore]
    from django_tasks.utils import normalize_json  # type: ignore[no-redef,unused-ignore]

__all__ = [
    "TASK_MAX_PRIORITY",
    "TASK_MIN_PRIORITY",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
