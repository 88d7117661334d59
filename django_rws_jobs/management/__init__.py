"""The management commands (``commands/``), which Django finds here: ``rws_worker`` runs the
workers, ``rws_health`` answers probes, ``rws_queues`` pauses and lists queues, ``rws_schedules``
lists the cron schedules, ``rws_prune_task_results`` deletes old task results. Entry points: they
may import any part."""

from __future__ import annotations

from django_rws_jobs.conf import jobs_settings


def setting_default(key: str) -> str:
    """How a help text names an option's default that a setting gives: the setting's full name
    and its value now (tests/test_docs.py::test_help_texts_name_each_default_and_its_setting)."""
    return f"RWS_JOBS[{key!r}], now {getattr(jobs_settings, key)!r}"
