"""The database, spoken to safely: the bottom part, which imports no other part.

One backend per database (``backends/``: the queue's SQL and what differs between SQLite,
PostgreSQL and MariaDB/MySQL), the worker's own connections (``connections``), a deadline on each
of the worker's statements (``deadline``), the database's clock (``clock``), the in-process
wake-up a commit sets (``wakeup``), and what a value must be before it reaches a column
(``validation``).

Invariants: every time the queue compares is the database's, never a host's
(tests/test_clock.py); a worker whose connection dies silently gives up the statement within its
deadline and goes on on a new connection (tests/test_dead_connections.py); a value out of a
column's bounds is refused with an error naming it and the limit (tests/test_input.py).
"""
