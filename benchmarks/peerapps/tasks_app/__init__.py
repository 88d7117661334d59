"""The ``django.tasks`` peers (django-ox, django-tasks-db): ``enqueue(N)`` enqueues N stamp tasks,
one call each (each its own transaction), on the backend of the TASKS setting;
``python -m django ox_worker --concurrency 4`` or ``python -m django db_worker`` drains them."""
