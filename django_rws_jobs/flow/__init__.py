"""Flow control: which due jobs a worker may start now. Imports only ``database``.

Per-key concurrency (``concurrency_keys``), queue concurrency and rate limits (``limits``, read
from ``RWS_JOBS["QUEUES"]``, and ``limited_claims``, the claims that honour them) and pauses
(``pauses``).

Invariants, across every worker on every machine: at most ``concurrency_limit`` jobs of a key
are pending or running (tests/test_concurrency_keys.py); a limited queue runs at most its limit
at once and starts at most its rate in any window (tests/test_limits.py); a paused queue starts
nothing once its pause has been read, at most ``QueueFilter.REFRESH`` seconds after it
(tests/test_pauses.py).
"""
