"""The claim of a queue with limits (RWS_JOBS["QUEUES"]): one short transaction under the lock of
the queue's ``rws_queues`` row.

Invariant: the claims of one limited queue run one at a time (the row lock; SQLite's write lock),
and each counts the queue's running jobs from the job rows themselves, so a slot is held exactly
while a job of the queue is running: every way out of running (success, failure, retry, hand back,
time limit, the dead-letter list, recovery of an expired lease) frees it once, by changing the row,
and nothing can leak or be freed twice
(tests/test_limits.py::test_the_bookkeeping_matches_a_model_whatever_the_interleaving).

Invariant: a rate limit of N per period T lets at most N claims take a job in any interval of T
(half-open: a job may start T after the one N before it), by the queue's clock to the microsecond
(tests/test_limits.py::test_a_rate_limit_frees_a_start_exactly_one_period_after_it and the
worker test beside it). The queue's log (``RateLog``) keeps its last starts, and a claim takes a
job only if the start N before it is at least T old.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.db import IntegrityError

from ..database import clock
from ..database.backends.claimed import CLAIM_COLUMNS, Claimed, claim_order_key
from ..database.backends.statements import CLAIM_SET, placeholders
from ..models import Queue, QueueStart
from .limits import QueueLimits

DUE = "status = 'pending' AND queue = %s AND next_run_at <= %s"
ORDER = "priority DESC, next_run_at, created_at, id"
#: The log's times are unix microseconds.
US = 1_000_000


def claim_limited(
    store: Any,
    queue: str,
    limits: QueueLimits,
    token: str,
    now: int,
    lease_until: int,
    want: int,
    at: float | None = None,
) -> tuple[list[Claimed], bool]:
    """Claim up to ``want`` due jobs of ``queue`` within its limits. Returns the jobs claimed and
    whether due jobs were left for the limits (a ``--burst`` worker waits for them).

    ``now`` decides what is due and is the claim's start time; the rate limit counts by the
    queue's clock read once the queue's lock is held (the database server's, in the statement
    that reads the log; the host's on SQLite), or by ``at`` (unix seconds: tests)."""
    try:
        with store.writes, store.atomic(), store.cursor() as c:
            return _claim(store, c, queue, limits, token, now, lease_until, want, at)
    except IntegrityError:  # another process inserted the queue's row meanwhile: next round
        return [], True


def claim_limited_queues(
    store: Any,
    queues: list[str],
    limits: dict[str, QueueLimits],
    token: str,
    now: int,
    lease_until: int,
    want: int,
) -> tuple[list[Claimed], bool]:
    """claim_limited for each of ``queues`` in turn until ``want`` jobs are claimed, each in its
    own transaction. Returns the jobs and whether any queue left due jobs for its limits."""
    claimed: list[Claimed] = []
    held_back = False
    for queue in queues:
        if len(claimed) >= want:
            break
        got, left = claim_limited(store, queue, limits[queue], token, now, lease_until, want - len(claimed))
        claimed += got
        held_back = held_back or left
    return claimed, held_back


def _claim(
    store: Any,
    c: Any,
    queue: str,
    limits: QueueLimits,
    token: str,
    now: int,
    lease_until: int,
    want: int,
    at: float | None,
) -> tuple[list[Claimed], bool]:
    # The queue's row, locked (SQLite: the transaction holds the write lock). A claim that takes
    # nothing writes nothing, so it wakes no idle SQLite worker (PRAGMA data_version).
    c.execute(
        f"SELECT rate_slots, rate_next FROM rws_queues WHERE name = %s{store.features.row_lock}", [queue]
    )
    row = c.fetchone()
    if row is None:
        c.execute(
            "INSERT INTO rws_queues (name, paused, rate_slots, rate_next) VALUES (%s, %s, 0, 0)",
            [queue, False],
        )
        row = (0, 0)
    allowed = want
    if limits.concurrency is not None:
        c.execute("SELECT COUNT(*) FROM rws_jobs WHERE status = 'running' AND queue = %s", [queue])
        allowed = min(allowed, limits.concurrency - c.fetchone()[0])
    if limits.rate is not None:
        allowed = min(allowed, limits.rate)
    if allowed <= 0:
        c.execute(f"SELECT 1 FROM rws_jobs WHERE {DUE} LIMIT 1", [queue, now])
        return [], c.fetchone() is not None
    c.execute(f"SELECT id FROM rws_jobs WHERE {DUE} ORDER BY {ORDER} LIMIT {allowed + 1}", [queue, now])
    ids = [row[0] for row in c.fetchall()]
    if not ids:
        return [], False
    log = None
    if limits.rate is not None:
        log = RateLog(queue, limits, *row)
        allowed = log.allowed(store, c, min(allowed, len(ids)), at)
    left = len(ids) > allowed
    ids = ids[:allowed]
    if not ids:
        return [], left
    marks = placeholders(len(ids))
    c.execute(
        f"UPDATE rws_jobs SET {CLAIM_SET} WHERE id IN ({marks}) AND status = 'pending'",
        [token, lease_until, now, *ids],
    )
    c.execute(f"SELECT {CLAIM_COLUMNS} FROM rws_jobs WHERE id IN ({marks}) AND locked_by = %s", [*ids, token])
    claimed = sorted((Claimed.from_row(row, token) for row in c.fetchall()), key=claim_order_key)
    if log is not None and claimed:
        log.write(store, c, len(claimed))
    return claimed, left


class RateLog:
    """The log of a rate-limited queue's last starts: ``rws_queue_starts``' rows of the queue, a
    ring of ``slots`` slots (``rws_queues.rate_slots``), written in the order of time from
    ``rws_queues.rate_next`` round. So, read from ``next`` round, the ring is its starts oldest
    first, and a slot never written holds no start (older than any).

    Invariant: the ring's times never decrease in that order (a claim writes at its time, the
    queue's clock or the ring's newest time, whichever is later), so the N most recent starts are
    its last N slots in that order, and the k-th oldest of them is the one a k-th start now must
    be a period after
    (tests/test_limits.py::test_a_claim_whose_clock_is_behind_the_log_writes_no_earlier_time).

    A limit N above the ring's size grows the ring when the claim writes: the new slots hold no
    start and go first in the order, before ``next`` (the rows from ``next`` on move up by the
    growth); a smaller N reads the ring's last N and leaves the rest
    (tests/test_limits.py::test_a_changed_rate_limit_keeps_the_starts_it_counts).
    """

    def __init__(self, queue: str, limits: QueueLimits, slots: int, next_slot: int):
        assert limits.rate is not None
        self.queue = queue
        self.rate = limits.rate
        self.period_us = limits.period * US
        self.slots = slots  # the ring as stored (0: no ring yet)
        self.next = next_slot % slots if slots else 0
        self.size = max(slots, self.rate)  # the ring's size once this claim writes
        self.t = 0  # the claim's time, unix microseconds (set by allowed)

    def stored(self, j: int) -> int | None:
        """The stored slot of the ``j``-th oldest of the ring (of ``size``): None for a slot the
        growth adds, which holds no start."""
        grown = self.size - self.slots
        return None if j < grown else (self.next + j - grown) % self.slots

    def allowed(self, store: Any, c: Any, k: int, at: float | None) -> int:
        """How many of ``k`` jobs may start now: the leading ones of the N most recent starts
        that are a period old or none. Reads them, the newest start and the queue's clock."""
        first = self.size - self.rate  # the oldest of the N most recent starts
        counted = [self.stored(j) for j in range(first, first + k)]
        newest = (self.next - 1) % self.slots if self.slots else None
        wanted = {s for s in [*counted, newest] if s is not None}
        times, server_now = _read(store, c, self.queue, sorted(wanted), at)
        if server_now is None:  # SQLite, or a time given: read after the lock, as the server's is
            server_now = _us(clock.now(store.conn.alias) if at is None else at)
        latest = None if newest is None else times.get(newest)
        self.t = server_now if latest is None else max(server_now, latest)
        free = 0
        for slot in counted:
            started = None if slot is None else times.get(slot)
            if started is not None and started > self.t - self.period_us:
                break
            free += 1
        return free

    def write(self, store: Any, c: Any, n: int) -> None:
        """Record ``n`` starts at the claim's time in the ``n`` oldest slots, and move ``next``."""
        if not self.slots:
            # A new ring: rows a ring of this name left (its rws_queues row deleted) go first.
            c.execute("DELETE FROM rws_queue_starts WHERE queue = %s", [self.queue])
        elif self.size > self.slots:
            # Growth: the slots from ``next`` on move up, leaving the new ones before them. In
            # two steps, through negative slots, so that no row lands on one not yet moved.
            grown = self.size - self.slots
            c.execute(
                "UPDATE rws_queue_starts SET slot = -1 - (slot + %s) WHERE queue = %s AND slot >= %s",
                [grown, self.queue, self.next],
            )
            c.execute(
                "UPDATE rws_queue_starts SET slot = -1 - slot WHERE queue = %s AND slot < 0", [self.queue]
            )
        rows = [(self.queue, (self.next + i) % self.size, self.t) for i in range(n)]
        c.execute(
            *store.backend.upsert_adding("rws_queue_starts", ["queue", "slot"], [], ["started_us"], rows)
        )
        c.execute(
            "UPDATE rws_queues SET rate_slots = %s, rate_next = %s WHERE name = %s",
            [self.size, (self.next + n) % self.size, self.queue],
        )


def next_start(using: str, queue: str, limits: QueueLimits, at: float) -> float | None:
    """When ``queue``'s rate limit next lets a job start (unix seconds), or None when it lets one
    start at ``at``: the oldest of its N most recent starts, a period on (admin/waits.py)."""

    row = Queue.objects.using(using).filter(name=queue).values_list("rate_slots", "rate_next").first()
    if row is None or limits.rate is None:
        return None
    log = RateLog(queue, limits, *row)
    slot = log.stored(log.size - log.rate)
    if slot is None:
        return None
    rows = QueueStart.objects.using(using).filter(queue=queue, slot=slot).values_list("started_us", flat=True)
    started = rows.first()
    if started is None or started + log.period_us <= _us(at):
        return None
    return (started + log.period_us) / US


def _read(
    store: Any, c: Any, queue: str, slots: list[int], at: float | None
) -> tuple[dict[int, int], int | None]:
    """The times of ``queue``'s log ``slots`` that hold one, and, unless ``at`` is given, the
    database server's clock (None on SQLite), both in unix microseconds, in one statement."""
    clock_sql = store.features.server_clock_sql if at is None else None
    parts, params = [], []
    if clock_sql is not None:
        parts.append(f"SELECT -1, ({clock_sql})")
    if slots:
        marks = placeholders(len(slots))
        parts.append(f"SELECT slot, started_us FROM rws_queue_starts WHERE queue = %s AND slot IN ({marks})")
        params = [queue, *slots]
    if not parts:
        return {}, None
    c.execute(" UNION ALL ".join(parts), params)
    # (The UNION may return the log's integers as decimals; the clock is a decimal or a float.)
    times = {int(slot): int(value) if slot != -1 else _server_us(value) for slot, value in c.fetchall()}
    return times, times.pop(-1, None)


def _us(seconds: float) -> int:
    return round(seconds * US)


def _server_us(seconds: Any) -> int:
    """The server's clock as it returns it (unix seconds, a decimal or a float) in microseconds."""
    return int(Decimal(str(seconds)) * US)
