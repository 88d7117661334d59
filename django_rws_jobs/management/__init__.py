"""The management commands (``commands/``), which Django finds here: ``rws_worker`` runs the
workers, ``rws_health`` answers probes, ``rws_queues`` pauses and lists queues, ``rws_schedules``
lists the cron schedules, ``rws_prune_task_results`` deletes old task results. Entry points: they
may import any part."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from django_rws_jobs.conf import jobs_settings
from django_rws_jobs.database.connections import queue_alias


def setting_default(key: str) -> str:
    """How a help text names an option's default that a setting gives: the setting's full name
    and its value now (tests/test_docs.py::test_help_texts_name_each_default_and_its_setting)."""
    return f"RWS_JOBS[{key!r}], now {getattr(jobs_settings, key)!r}"


class QueueCommand(BaseCommand):
    """A command that works on the queue's database alone (its ``--database`` option, or
    ``RWS_JOBS["DATABASE"]``). Its system checks look at that database only: Django 6.1 otherwise
    runs the model checks against every alias, so a reports database or a replica that is down
    would stop a worker from starting (tests/test_worker.py::
    test_a_worker_starts_while_another_database_is_down)."""

    def execute(self, *args: Any, **options: Any) -> Any:
        self.queue_database = options.get("database")
        return super().execute(*args, **options)

    def check(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("databases") is None:
            try:
                kwargs["databases"] = [queue_alias(getattr(self, "queue_database", None))]
            except (TypeError, ValueError):
                kwargs["databases"] = []  # the command's handle() reports the bad alias
        super().check(*args, **kwargs)
