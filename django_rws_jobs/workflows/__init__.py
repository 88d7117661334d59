"""Work made of many jobs: the rows that tie jobs together and what their outcomes do. Imports
``queue`` and the parts below it.

A batch's members as enqueue adds them (``members``), what a member's handler recorded for the
batch (``outputs``), jobs that wait for jobs (``dependencies``: blocked until what they wait for
has ended; ``dependency_outcomes``: then released or cancelled), and what members' outcomes do to
their batch (``batch_outcomes``: the finish and its callbacks; ``batch_upkeep``: the keeper's
sweep of what a crash left, and the prune). The calls that make these
(``batch()``, ``chain()``, ``enqueue(after=)``) are in ``api``.

Invariants: a batch's callbacks are enqueued once per finish, and a blocked job is released or
cancelled once, whichever workers settle its members at the same time (tests/test_batches.py,
tests/test_dependencies.py, tests/test_batch_workers.py).
"""
