"""The queue: a job as a row. Imports ``database``, ``flow`` and ``checks``.

The handlers (``registry``) and their types' waits before a retry (``backoff``), job ids (``ids``),
the statements that claim, finish, renew, hand back and recover jobs on one connection (``store``),
a job's metadata as stored (``metadata``), a progress report as read back (``progress``), the
middleware chains around enqueue and run (``middleware``). ``preload`` sets Django up in the process
pool's fork server.

Invariants: a claimed job is held by one worker at a time, and every write of its outcome is fenced
by its claim token (tests/test_concurrency.py); a claim takes no more jobs than it asks for and
takes them in priority, due time and insertion order (tests/test_tick.py).
"""
