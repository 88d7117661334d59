"""Per-minute counters per queue and job type (``rws_metrics``), and what reads them.

Each worker adds up, in memory, the runs its executors timed and the outcomes it recorded, per
minute of the queue's clock, queue and job type; its completer writes them at most once a
FLUSH_EVERY seconds (so at most once per batch), in one transaction of one statement that adds
them to the stored rows (an upsert: several workers add to one minute). Rows a write failed to
store are written again only if it surely did not commit: rows whose COMMIT got no answer may be
stored, and are dropped rather than counted twice
(tests/test_metrics.py::test_a_counters_write_whose_commit_reply_is_lost_counts_once). Workers
prune minutes past METRICS_RETENTION by folding them into ``rws_metric_totals`` in the same
transaction, so the Prometheus counters (totals plus minutes) never go down
(tests/test_metrics.py::test_pruning_keeps_the_counters_monotonic).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from itertools import chain, groupby
from operator import attrgetter, itemgetter
from typing import Any

from django.db import connections

from ..conf import jobs_settings
from ..database.backends import backend_for

logger = logging.getLogger("django_rws_jobs")

KEYS = ("minute", "queue", "job_type")
ADDS = ("done", "failed", "dead", "cancelled", "runs", "run_seconds", "wait_seconds", "snoozed")
MAXES = ("run_seconds_max",)
#: Where the runs' sums and longest run are in a row's values (ADDS then MAXES).
RUNS, RUN_SECONDS, WAIT_SECONDS = (ADDS.index(c) for c in ("runs", "run_seconds", "wait_seconds"))
LONGEST = len(ADDS) + MAXES.index("run_seconds_max")
#: The counters an outcome adds to (failed counts failed attempts, the last one included).
OUTCOME_COLUMNS = {
    "done": ("done",),
    "retry": ("failed",),
    "dead": ("failed", "dead"),
    "cancelled": ("cancelled",),
    "snoozed": ("snoozed",),
}
#: Seconds between two writes of a worker's counters.
FLUSH_EVERY = 1.0
#: Runs a worker keeps one by one, and batches of outcomes (with their jobs): the executor whose
#: run makes this many adds them up.
FOLD_AT = 256
ENDS_FOLD_AT = 64
#: Minutes a worker prunes in one transaction.
PRUNE_BATCH = 1000
JOB_TYPE_MAX = 191
#: locked_due: how many of the jobs due longest it looks at, and the seconds between its looks.
LOCKED_LOOKED_AT = 100
LOCKED_RECHECK = 1.0


class Counters:
    """One worker's counters not written yet.

    The executors append an event per run to a deque and the recorders one per batch (C calls,
    no lock: the per-job cost of the counters, measured in docs/benchmarks.md). They are added
    up per queue and job type, with C-level sorts, counts and sums, by the executor whose run
    makes FOLD_AT runs or ENDS_FOLD_AT batches waiting (so a worker keeps at most about that
    many, not a second's, and the jobs of no more batches:
    tests/test_metrics.py::test_the_counters_add_up_runs_and_outcomes_as_they_come) and by
    ``take``, in the minute of the write that carries them (at most FLUSH_EVERY late).
    ``_folding`` is held by whoever adds them up, so each event is taken once. Rows a write could
    not store wait in ``pending``."""

    def __init__(self) -> None:
        # (queue, job type, seconds, start on time.monotonic(), next_run_at)
        self.runs: deque[tuple[str, str, float, float, int]] = deque()
        # (jobs, outcomes) of a batch: its jobs live until the next adding up (ENDS_FOLD_AT)
        self.ends: deque[tuple[tuple[Any, ...], Sequence[str]]] = deque()
        self.pending: dict[tuple[int, str, str], list[float]] = {}
        # Added up: (queue, job type): [runs, sum of seconds, sum of starts, sum of next_run_at,
        # max seconds]; and the outcomes, per (queue, job type, outcome)
        self.folded: dict[tuple[str, str], list[float]] = {}
        self.counted: Counter[tuple[str, str, str]] = Counter()
        self._folding = threading.Lock()

    def ran(self, job: Any, seconds: float, started: float) -> None:
        """An attempt of ``job`` ran ``seconds`` from ``started`` (``time.monotonic()``)."""
        self.runs.append((job.queue, job.job_type, seconds, started, job.next_run_at))
        if len(self.runs) >= FOLD_AT or len(self.ends) >= ENDS_FOLD_AT:
            self._fold_now()

    def _fold_now(self) -> None:
        """Add up what waits, unless another thread is adding up: it takes what waits."""
        if self._folding.acquire(blocking=False):
            try:
                self._fold()
            finally:
                self._folding.release()

    def _fold(self) -> None:
        """Add the runs up into ``folded``, the outcomes into ``counted`` (the caller holds
        ``_folding``)."""
        ends = [self.ends.popleft() for _ in range(len(self.ends))]
        if ends:
            jobs = tuple(chain.from_iterable(map(_JOBS, ends)))
            ended = tuple(chain.from_iterable(map(_OUTCOMES, ends)))
            queues, types = tuple(map(_QUEUE, jobs)), tuple(map(_TYPE, jobs))
            if jobs and _alike(queues) and _alike(types) and len(ended) == len(jobs):
                for outcome, n in Counter(ended).items():
                    self.counted[(queues[0], types[0], outcome)] += n
            else:
                self.counted.update(zip(queues, types, ended, strict=False))
        runs = [self.runs.popleft() for _ in range(len(self.runs))]
        if not runs:
            return
        queues, types, seconds, starts, dues = zip(*runs, strict=True)
        # Most runs are of one queue and job type: C-level sums of the columns, no sort.
        groups = (
            [((queues[0], types[0]), (seconds, starts, dues))]
            if _alike(queues) and _alike(types)
            else [
                ((queue, job_type), tuple(zip(*group, strict=True))[2:])
                for (queue, job_type), group in groupby(sorted(runs, key=_QUEUE_AND_TYPE), _QUEUE_AND_TYPE)
            ]
        )
        for key, (seconds, starts, dues) in groups:
            total = self.folded.get(key)
            if total is None:
                total = self.folded[key] = [0, 0.0, 0.0, 0, 0.0]
            total[0] += len(seconds)
            total[1] += sum(seconds)
            total[2] += sum(starts)
            total[3] += sum(dues)
            total[4] = max(total[4], max(seconds))

    def ended(self, jobs: Sequence[Any], outcomes: Sequence[str]) -> None:
        """The outcomes recorded for ``jobs`` (lost ones count nowhere). One C call for the
        recorder (the dispatcher's claim loop waits on it); the executors add them up."""
        self.ends.append((tuple(jobs), outcomes))

    def take(self, now: float, mono: float) -> Batch:
        """The rows to write (KEYS + ADDS + MAXES each), forgotten here. ``now`` and ``mono``:
        the queue's clock and ``time.monotonic()`` read together: the minute, and the runs' starts."""
        rows, self.pending = self.pending, {}
        minute = int(now) - int(now) % 60

        def row(queue: str, job_type: str) -> list[float]:
            key = (minute, queue, job_type[:JOB_TYPE_MAX])
            found = rows.get(key)
            if found is None:
                found = rows[key] = [0] * (len(ADDS) + len(MAXES))
            return found

        with self._folding:
            self._fold()
            folded, self.folded = self.folded, {}
            counted, self.counted = self.counted, Counter()
        for (queue, job_type), (n, seconds, starts, dues, longest) in folded.items():
            r = row(queue, job_type)
            r[RUNS] += n
            r[RUN_SECONDS] += seconds
            # Each start on the queue's clock is now - (mono - start): its wait, start - due.
            r[WAIT_SECONDS] += n * (now - mono) + starts - dues
            r[LONGEST] = max(r[LONGEST], longest)
        for (queue, job_type, outcome), n in counted.items():
            for index in OUTCOME_INDEXES.get(outcome, ()):
                row(queue, job_type)[index] += n
        return Batch([*key, *values] for key, values in sorted(rows.items()))

    def give_back(self, rows: Sequence[Sequence[Any]]) -> None:
        """Rows a write failed to store: added to the next write, unless that write may have
        stored them (``Batch.maybe_stored``), which they would then count twice."""
        if getattr(rows, "maybe_stored", False):
            logger.warning(
                "metrics: %d counter row(s) dropped: their write's COMMIT got no answer, so they "
                "may be stored already",
                len(rows),
            )
            return
        for r in rows:
            merge(self.pending, (r[0], r[1], r[2]), r[3:])


class Batch(list[list[Any]]):
    """The rows of one write (Counters.take). ``maybe_stored`` is set once its COMMIT has been
    sent: from then on a failure may hide a commit, and the rows are neither written again nor
    given back (write, Counters.give_back)."""

    maybe_stored = False


_QUEUE_AND_TYPE = itemgetter(0, 1)
_JOBS, _OUTCOMES = itemgetter(0), itemgetter(1)
_QUEUE, _TYPE = attrgetter("queue"), attrgetter("job_type")


def _alike(names: tuple[str, ...]) -> bool:
    """Whether every one of ``names`` (at least one) equals the first (a C-level count)."""
    return names.count(names[0]) == len(names)


OUTCOME_INDEXES = {
    outcome: tuple(ADDS.index(c) for c in columns) for outcome, columns in OUTCOME_COLUMNS.items()
}


def merge(rows: dict[Any, list[Any]], key: Any, values: Sequence[Any]) -> None:
    """Add ``values`` (ADDS then MAXES) to ``rows[key]``: the ADDS summed, the larger of each MAX
    kept."""
    mine = rows.setdefault(key, [0] * (len(ADDS) + len(MAXES)))
    for i, value in enumerate(values):
        mine[i] = max(mine[i], value) if i >= len(ADDS) else mine[i] + value


def write(store: Any, rows: Sequence[Sequence[Any]]) -> None:
    """Add ``rows`` (Counters.take) to the stored minutes, in one transaction of one statement.

    A failure before the COMMIT is sent leaves nothing stored: the caller may write the rows
    again or give them back. Past that point a client-server database may have committed
    whatever the connection says, so a Batch is marked ``maybe_stored`` and a later call with it
    writes nothing (a retry by reconnect.Retry). SQLite answers in-process: a COMMIT that fails
    there did not commit."""
    if not rows:
        return
    if getattr(rows, "maybe_stored", False):
        logger.warning("metrics: %d counter row(s) not written again: they may be stored already", len(rows))
        return
    statement = store.backend.upsert_adding("rws_metrics", KEYS, ADDS, MAXES, rows)
    committing = False
    try:
        with store.writes, store.atomic():
            with store.cursor() as c:
                c.execute(*statement)
            committing = True
    except BaseException:
        if committing and isinstance(rows, Batch) and store.features.failed_commit_may_have_committed:
            rows.maybe_stored = True
        raise


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
            merge(totals, (row[1], row[2]), row[3:])
        ids = [row[0] for row in found]
        c.execute(f"DELETE FROM rws_metrics WHERE id IN ({', '.join(['%s'] * len(ids))})", ids)
        rows = [[*key, *values] for key, values in sorted(totals.items())]
        c.execute(*store.backend.upsert_adding("rws_metric_totals", KEYS[1:], ADDS, MAXES, rows))
        return len(ids)


def locked_due(alias: str, now: int, recheck: float = LOCKED_RECHECK) -> dict[str, int]:
    """queue -> its pending jobs due for over a lease (LEASE_SECONDS) that a transaction keeps
    locked, so that every claim skips them (of the LOCKED_LOOKED_AT due longest): a worker's
    transaction left open by a client that is gone, or a project's own long transaction on the
    queue's rows. A claim holds its rows for milliseconds: a job counts only if it is locked at
    two looks ``recheck`` seconds apart (the second made only when the first found one). Read by
    rws_health --max-locked-due and the metrics endpoint (BaseBackend.locked_due)."""
    backend = backend_for(connections[alias])
    before = now - int(jobs_settings.LEASE_SECONDS)
    found = backend.locked_due(before, LOCKED_LOOKED_AT)
    if found and recheck > 0:
        time.sleep(recheck)
        again = set(backend.locked_due(before, LOCKED_LOOKED_AT))
        found = [row for row in found if row in again]
    return dict(Counter(queue for _, queue in found))
