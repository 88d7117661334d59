"""What a caller does with jobs: the functions behind the package's public API. Imports
``workflows``, ``queue`` and the parts below it.

Enqueueing and reading jobs (``enqueue``: ``enqueue``, ``jobs``, ``failed_jobs``;
``enqueue_many``), cancelling (``cancellation``), the dead-letter list's retry and delete
(``dead_letters``), an operator's run now and reschedule (``due``), batches (``batches``:
``batch()``, ``call()``, ``get_batch()``) and chains (``chains``).

Invariants: an enqueue inside a transaction is stored with it or not at all, a unique key holds
one live job (tests/test_enqueue.py); a dead job is kept until an operator retries or deletes it
(tests/test_dead_letters.py); a cancel ends a pending job at once and a running one at its
worker's next look (tests/test_cancel.py).
"""
