"""Cron schedules that name a task: ``{"cron": "0 0 3 * * *", "task": "shop.tasks.report",
"args": [...], "kwargs": {...}}`` in ``RWS_JOBS["SCHEDULES"]``.

The schedule's job_type is the task row's (``django.tasks:<path>``) and its payload the JSON of
the arguments; at each due time the task is enqueued through its backend, in the transaction of
the schedule's compare-and-set (schedules._tick_one).
"""

from __future__ import annotations

import json
from typing import Any

from ..queue.registry import TASK_PREFIX
from .backend import arguments
from .results import load_task

#: The keys of a task schedule.
KEYS = ("cron", "task", "args", "kwargs")


def check(entry: dict[str, Any]) -> tuple[str, str, list[str]]:
    """(job_type, payload, problems) of a task schedule's entry."""
    path = entry["task"]
    other = [key for key in entry if key not in KEYS]
    if other:
        return "", "", [f"a task schedule takes {', '.join(KEYS)}; not {', '.join(map(repr, other))}"]
    args, kwargs = entry.get("args", []), entry.get("kwargs", {})
    if not isinstance(path, str) or not path:
        return "", "", [f"'task' must be the dotted path of a @task function, got {path!r:.60}"]
    if not isinstance(args, (list, tuple)) or not isinstance(kwargs, dict):
        return "", "", ["'args' must be a list and 'kwargs' a dict"]
    try:
        task = load_task(path)
        task.get_backend().validate_task(task)
        args, kwargs = arguments(args, kwargs)
    except Exception as exc:  # an import error, a non-task, InvalidTask: the check reports it
        return "", "", [f"task {path!r}: {exc}"]
    return TASK_PREFIX + path, json.dumps({"args": args, "kwargs": kwargs}), []


def enqueue(job_type: str, payload: str) -> str:
    """Enqueue the schedule's task; return its result's id."""

    task = load_task(job_type[len(TASK_PREFIX) :])
    data = json.loads(payload)
    return str(task.enqueue(*data["args"], **data["kwargs"]).id)
