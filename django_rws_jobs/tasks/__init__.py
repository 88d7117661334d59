"""A ``django.tasks`` backend on the queue's tables::

    TASKS = {"default": {"BACKEND": "django_rws_jobs.tasks.RwsJobsBackend", "QUEUES": ["default"]}}

The backend is imported on first use, so importing this package (as the app does at start-up)
needs neither Django 6 nor the ``django-tasks`` backport. It stores tasks as the queue's jobs:
it imports ``queue`` and the parts below it; ``schedules`` and ``worker`` import it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RwsJobsBackend", "RwsTask", "task"]


def __getattr__(name: str) -> Any:
    if name in ("RwsJobsBackend", "RwsTask"):
        from . import backend  # (needs django.tasks or its backport: see above)

        return getattr(backend, name)
    if name == "task":
        from .decorator import task  # (needs django.tasks or its backport: see above)

        return task
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
