"""Per-minute counters per queue and job type (``rws_metrics``), and what reads them.

Each worker adds up, in memory, the runs its executors timed and the outcomes it recorded, per
minute of the queue's clock, queue and job type; its completer writes them at most once a
FLUSH_EVERY seconds (so at most once per batch), in one statement that adds them to the stored
rows (an upsert: several workers add to one minute). Workers prune minutes past
METRICS_RETENTION by folding them into ``rws_metric_totals`` in the same transaction, so the
Prometheus counters (totals plus minutes) never go down
(tests/test_metrics.py::test_pruning_keeps_the_counters_monotonic).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import Any

KEYS = ("minute", "queue", "job_type")
ADDS = ("done", "failed", "dead", "cancelled", "runs", "run_seconds", "wait_seconds")
MAXES = ("run_seconds_max",)
#: The counters an outcome adds to (failed counts failed attempts, the last one included).
OUTCOME_COLUMNS = {
    "done": ("done",),
    "retry": ("failed",),
    "dead": ("failed", "dead"),
    "cancelled": ("cancelled",),
}
#: Seconds between two writes of a worker's counters.
FLUSH_EVERY = 1.0
#: Minutes a worker prunes in one transaction.
PRUNE_BATCH = 1000
JOB_TYPE_MAX = 191


class Counters:
    """One worker's counters not written yet: (minute, queue, job type) -> ADDS + MAXES."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rows: dict[tuple[int, str, str], list[float]] = {}

    def _row(self, now: float, job: Any) -> list[float]:
        key = (int(now) - int(now) % 60, job.queue, job.job_type[:JOB_TYPE_MAX])
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = [0] * (len(ADDS) + len(MAXES))
        return row

    def ran(self, job: Any, seconds: float, started: float) -> None:
        """An attempt of ``job`` ran ``seconds``, from ``started`` (the queue's clock)."""
        wait = max(started - job.next_run_at, 0.0)
        with self.lock:
            row = self._row(started, job)
            row[4] += 1
            row[5] += seconds
            row[6] += wait
            row[7] = max(row[7], seconds)

    def ended(self, jobs: Iterable[Any], outcomes: Iterable[str], now: float) -> None:
        """Count the outcomes recorded for ``jobs`` (lost ones count nowhere)."""
        with self.lock:
            for job, outcome in zip(jobs, outcomes, strict=False):
                columns = OUTCOME_COLUMNS.get(outcome)
                if columns:
                    row = self._row(now, job)
                    for column in columns:
                        row[ADDS.index(column)] += 1

    def take(self) -> list[list[Any]]:
        """The rows to write (KEYS + ADDS + MAXES each), forgotten here."""
        with self.lock:
            rows, self.rows = self.rows, {}
        return [[*key, *values] for key, values in sorted(rows.items())]

    def give_back(self, rows: Sequence[Sequence[Any]]) -> None:
        """Rows a write failed to store: added to the next write."""
        with self.lock:
            for row in rows:
                key = (row[0], row[1], row[2])
                mine = self.rows.setdefault(key, [0] * (len(ADDS) + len(MAXES)))
                for i, value in enumerate(row[3:]):
                    mine[i] = max(mine[i], value) if i >= len(ADDS) else mine[i] + value


def write(store: Any, rows: Sequence[Sequence[Any]]) -> None:
    """Add ``rows`` (Counters.take) to the stored minutes, in one statement."""
    if not rows:
        return
    with store.writes, store.cursor() as c:
        c.execute(*store.backend.upsert_adding("rws_metrics", KEYS, ADDS, MAXES, rows))


def prune(store: Any, before: int) -> int:
    """Fold the minutes before ``before`` into the totals and delete them, in one transaction;
    the minutes are locked first, so two workers never fold one twice."""
    columns = ", ".join(("id", "queue", "job_type", *ADDS, *MAXES))
    with store.writes, store.atomic(), store.cursor() as c:
        c.execute(
            f"SELECT {columns} FROM rws_metrics WHERE minute < %s ORDER BY minute "
            f"LIMIT {PRUNE_BATCH}{store.features.row_lock}",
            [before],
        )
        found = c.fetchall()
        if not found:
            return 0
        totals: dict[tuple[str, str], list[Any]] = {}
        for row in found:
            mine = totals.setdefault((row[1], row[2]), [0] * (len(ADDS) + len(MAXES)))
            for i, value in enumerate(row[3:]):
                mine[i] = max(mine[i], value) if i >= len(ADDS) else mine[i] + value
        ids = [row[0] for row in found]
        c.execute(f"DELETE FROM rws_metrics WHERE id IN ({', '.join(['%s'] * len(ids))})", ids)
        rows = [[*key, *values] for key, values in sorted(totals.items())]
        c.execute(*store.backend.upsert_adding("rws_metric_totals", KEYS[1:], ADDS, MAXES, rows))
        return len(ids)
