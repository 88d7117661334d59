"""The management commands (``commands/``), which Django finds here: ``rws_worker`` runs the
workers, ``rws_health`` answers probes, ``rws_queues`` pauses and lists queues, ``rws_schedules``
lists the cron schedules, ``rws_prune_task_results`` deletes old task results. Entry points: they
may import any part."""
