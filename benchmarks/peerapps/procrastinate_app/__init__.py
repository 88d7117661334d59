"""procrastinate's Django integration: ``enqueue(N)`` defers N stamp tasks, one call each (each
its own transaction); ``python -m django procrastinate worker --concurrency 4`` drains them."""
