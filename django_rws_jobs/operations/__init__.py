"""What an operator sees of the running workers. Imports the parts below it.

The live workers' rows and heartbeats (``worker_rows``), the counters the workers keep
(``metrics``) and their Prometheus export (``prometheus``, served by ``urls``), and times and
durations written for people (``humanize``), which the admin and the commands show.
``management/commands/rws_health.py`` reads them for probes.

Invariants: a worker counts as live while its heartbeat is at most three intervals old
(tests/test_workers.py); each job's outcome is counted once, in the minute it happened
(tests/test_metrics.py); health counts waiting jobs and skips paused queues
(tests/test_health.py).
"""
