"""Cron schedules. Imports the parts below it, up to ``tasks``.

The cron grammar (``cron``), the schedules declared in ``RWS_JOBS["SCHEDULES"]`` and by
``@job(schedule=...)`` with their system checks (``declared``), and the tick that enqueues each
due time (``ticks``).

Invariant: each due time of a schedule is enqueued once, however many workers on however many
machines tick at once, and whatever their clocks say (tests/test_schedules.py,
tests/test_clock.py).
"""
