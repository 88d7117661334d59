"""What a running job knows and tells: ``current_job()``. Imports ``api`` and the parts below it.

The context a handler reads (``context``: its job, its batch, its metadata) and what it tells
while it runs, written by a thread of its own on a connection of its own (``reports``: progress
and saved metadata).

Invariants: a handler sees its own job, never another's (tests/test_current_job.py); a report
is written fenced by the attempt's claim (``locked_by``), and an attempt that fails or is stopped
keeps its last progress and metadata (tests/test_reports.py).
"""
