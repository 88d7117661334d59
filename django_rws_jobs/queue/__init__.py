"""The queue: a job's life from enqueue to its end. Imports ``database``, ``flow`` and ``checks``.

The handlers (``registry``), enqueueing and reading jobs (``api``), their ids (``ids``), the
statements that claim, finish, renew, hand back and recover jobs on one connection (``store``),
running a handler and recording its outcome, with retries and backoff (``runner``), the
dead-letter list (``dead_letters``) and cancelling (``cancellation``); batches (``batches``, the
API; ``members``, joining at enqueue; ``batch_outcomes``, what members' outcomes do to a batch)
and jobs that wait for jobs (``dependencies``). ``preload`` sets Django up in the process pool's
fork server.

Invariants: a claimed job is held by one worker at a time, and every write of its outcome is
fenced by its claim token (tests/test_concurrency.py); a failure is retried with backoff until
``max_attempts``, then the job is dead, kept until an operator retries or deletes it
(tests/test_dead_letters.py); a job whose worker was killed runs again once its lease expires
(tests/test_worker.py); a batch's callbacks are enqueued once per finish and a blocked job is
released or cancelled once (tests/test_batches.py, tests/test_dependencies.py,
tests/test_batch_workers.py).
"""
