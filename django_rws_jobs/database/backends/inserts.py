"""The INSERT statements of enqueue and enqueue_many, in batches within a statement's limits."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any, TypeVar

T = TypeVar("T")

#: The columns of one job's INSERT parameters (api.prepare), in order; unique_hash last.
INSERT_COLUMNS = (
    "id",
    "job_type",
    "payload",
    "max_retries",
    "next_run_at",
    "created_at",
    "queue",
    "priority",
    "unique_key",
    "timeout",
    "status",
    "concurrency_key",
    "concurrency_limit",
    "batch_id",
    "batch_event",
    "metadata",
    "unique_hash",
)
INSERT_HEAD = (
    "INSERT INTO rws_jobs (id, job_type, payload, attempts, max_retries, next_run_at, created_at, "
    "queue, priority, unique_key, timeout, status, concurrency_key, concurrency_limit, batch_id, "
    "batch_event, metadata, unique_hash) VALUES "
)
INSERT_VALUES = "(%s, %s, %s, 0, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
INSERT_SQL = INSERT_HEAD + INSERT_VALUES
COPY_SQL = f"COPY rws_jobs ({', '.join(INSERT_COLUMNS)}) FROM STDIN"


def insert_multirow(c: Any, rows: Iterator[list[Any]], batch_size: int, max_params: int | None) -> None:
    """Multi-row INSERTs through the cursor ``c``, at most ``max_params`` parameters each."""
    if max_params is not None:
        batch_size = min(batch_size, max(max_params // len(INSERT_COLUMNS), 1))
    for chunk in batches(rows, batch_size):
        insert_rows(c, chunk)


def insert_rows(c: Any, chunk: list[list[Any]]) -> None:
    c.execute(INSERT_HEAD + ", ".join([INSERT_VALUES] * len(chunk)), [v for row in chunk for v in row])


def batches(rows: Iterator[T], size: int) -> Iterator[list[T]]:
    """``rows`` in lists of ``size`` (the last one shorter)."""
    while chunk := list(itertools.islice(rows, size)):
        yield chunk
