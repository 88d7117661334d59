"""Exceptions a task's recorded errors may name (TaskError.exception_class_path)."""


class WorkerLost(Exception):
    """The worker running the task stopped renewing its lease (it was killed or lost its
    database); recovery took the task back as a failed attempt."""


class TaskNotFound(Exception):
    """A task row names no importable ``@task`` function."""
