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

from collections import deque
from collections.abc import Sequence
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
    """One worker's counters not written yet.

    The executors and the recorders only append an event to a deque (one C call, no lock: the
    per-job cost of the counters); ``take`` adds them up per (minute, queue, job type) once per
    write. Rows a write could not store wait in ``pending`` for the next one."""

    def __init__(self) -> None:
        self.runs: deque[tuple[Any, float, float]] = deque()  # (job, seconds, start on time.monotonic())
        self.ends: deque[tuple[Sequence[Any], Sequence[str], float]] = deque()  # (jobs, outcomes, now)
        self.pending: dict[tuple[int, str, str], list[float]] = {}

    def ran(self, job: Any, seconds: float, started: float) -> None:
        """An attempt of ``job`` ran ``seconds`` from ``started`` (``time.monotonic()``)."""
        self.runs.append((job, seconds, started))

    def ended(self, jobs: Sequence[Any], outcomes: Sequence[str], now: float) -> None:
        """The outcomes recorded for ``jobs`` at ``now`` (the queue's clock; lost ones count nowhere)."""
        self.ends.append((jobs, outcomes, now))

    def take(self, now: float, mono: float) -> list[list[Any]]:
        """The rows to write (KEYS + ADDS + MAXES each), forgotten here. ``now`` and ``mono``:
        the queue's clock and ``time.monotonic()`` read together, which date the runs."""
        rows, self.pending = self.pending, {}
        width = len(ADDS) + len(MAXES)

        def row(at: float, job: Any) -> list[float]:
            key = (int(at) - int(at) % 60, job.queue, job.job_type[:JOB_TYPE_MAX])
            found = rows.get(key)
            if found is None:
                found = rows[key] = [0] * width
            return found

        runs, ends = self.runs, self.ends
        while runs:
            job, seconds, started = runs.popleft()
            at = now - (mono - started)
            r = row(at, job)
            r[4] += 1
            r[5] += seconds
            r[6] += max(at - job.next_run_at, 0.0)
            r[7] = max(r[7], seconds)
        while ends:
            jobs, outcomes, at = ends.popleft()
            for job, outcome in zip(jobs, outcomes, strict=False):
                for column in OUTCOME_COLUMNS.get(outcome, ()):
                    row(at, job)[ADDS.index(column)] += 1
        return [[*key, *values] for key, values in sorted(rows.items())]

    def give_back(self, rows: Sequence[Sequence[Any]]) -> None:
        """Rows a write failed to store: added to the next write."""
        for r in rows:
            mine = self.pending.setdefault((r[0], r[1], r[2]), [0] * (len(ADDS) + len(MAXES)))
            for k, value in enumerate(r[3:]):
                mine[k] = max(mine[k], value) if k >= len(ADDS) else mine[k] + value


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
