"""django-ox, a ``django.tasks`` backend: ``enqueue(N)`` enqueues N stamp tasks, one call each
(each its own transaction); ``python -m django ox_worker --concurrency 4`` drains them."""
