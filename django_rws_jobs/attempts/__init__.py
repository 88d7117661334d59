"""One attempt of a claimed job: running its handler and recording its outcome. Imports ``running``,
``api``, ``workflows``, ``queue`` and the parts below them.

``run`` calls the handler outside any transaction, with ``current_job()`` set and the middleware
around it; ``decisions`` turns what it raised into an outcome (the handler's ``Snooze``, ``Retry``,
``Fail`` or ``Cancel``, its type's ``fail_on`` and backoff); ``outcomes`` records what came of it,
fenced by the claim: success, a snooze, a retry after its backoff, the dead-letter list, cancelled,
and a lost worker's jobs taken back (``recover``). The recording also settles the batches and
dependents of the jobs it ended (``workflows.batch_outcomes.settle``).

Invariants: a failure is retried with backoff until its ``max_retries`` are spent, then the job is
dead (tests/test_dead_letters.py); a snooze never charges an attempt (tests/test_outcomes.py); a job
whose worker was killed runs again once its lease expires (tests/test_worker.py); an outcome the
database refuses is recorded plainly, never lost (tests/test_faults.py).
"""
