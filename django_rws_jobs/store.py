"""The SQL of the hot path: claim, finish (fenced), renew, hand back, recover.

Raw SQL on purpose: these statements run for every job, and each must be one round trip where
the database allows it. What differs between databases is kept here, in one place.
"""

from __future__ import annotations

import functools
import re
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Sequence

from django.db.backends.base.base import BaseDatabaseWrapper

from .db import atomic, is_registered, sends_several, write_lock
from .models import Job, Status

CLAIM_COLUMNS = (
    "id, job_type, payload, queue, priority, attempts, max_retries, next_run_at, created_at, unique_key"
)
ORDER = "priority DESC, next_run_at ASC, created_at ASC, id ASC"
#: Bands without due jobs a claim's band walk passes before it looks for the highest due band by
#: reading the due rows (see due_band_select).
MAX_BAND_WALK = 64
#: Prefix of the lease given to a running row found without one (a seed writer's claim).
SEED_MARKER = "seed:"
#: MariaDB/MySQL: how long a dispatcher's claims start after the last row it claimed (seconds).
RESUME_SECONDS = 1.0
CLAIM_SET = "status = 'running', locked_by = %s, locked_until = %s, started_at = %s"


@dataclass
class Claimed:
    """A job this worker holds, with the token that fences its outcome."""

    id: str
    job_type: str
    payload: str
    queue: str
    priority: int
    attempts: int
    max_retries: int
    next_run_at: int
    created_at: int
    unique_key: str | None
    token: str

    def as_job(self, **changes: Any) -> Job:
        fields = {k: v for k, v in self.__dict__.items() if k != "token"}
        fields.update(changes)
        return Job(**fields)


def _queue_filter(queues: Sequence[str] | None, vendor: str = "") -> tuple[str, list[Any]]:
    if not queues:
        return "", []
    if _one_queue(queues):  # an equality: the queue index's ranges
        if vendor == "postgresql":
            # Written into the claim, which is prepared: a generic plan for any queue weighs the
            # queue by the table's average and keeps to the claim index, reading other queues'
            # rows. An E'' literal escapes the same whatever standard_conforming_strings says;
            # "%" is doubled for the driver's placeholder syntax.
            text = queues[0].replace("\\", "\\\\").replace("'", "''").replace("%", "%%")
            return f" AND queue = E'{text}'", []
        return " AND queue = %s", list(queues)
    return f" AND queue IN ({', '.join(['%s'] * len(queues))})", list(queues)


def _one_queue(queues: Sequence[str] | None) -> bool:
    """A worker that serves one queue claims through the index led by queue, ``(status, queue,
    priority, next_run_at, created_at, id)``: its bands are ranges within the queue, so other
    queues' due and future rows lie outside them (with 100,000 of each in another queue, a
    claim read them all: 48 ms on PostgreSQL, 74 on SQLite, 249 on MariaDB, measured). Several
    queues share the claim index and filter its ranges by queue."""
    return bool(queues) and len(queues) == 1


def band_select(columns: str, queues: Sequence[str] | None, priority: int, now: int,
                limit: int, vendor: str = "") -> tuple[str, list[Any]]:
    """Due jobs of one priority, oldest first: one range of the claim index, stopped by LIMIT.

    LIMIT is written into the statement, not bound: PostgreSQL plans a prepared statement once
    for any parameters after a few runs, and with an unknown LIMIT that generic plan reads the
    whole table (272 ms with a million rows, measured); with a small literal LIMIT it is the
    index range. The few limits a worker uses (1 to its thread count) make few statements.
    MariaDB is told the index: it would weigh every index the conditions name each time it plans
    (80 us of a 310 us claim, measured, with a resume point's conditions).
    """
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ValueError(f"limit must be a positive int, got {limit!r}")
    qsql, qparams = _queue_filter(queues, vendor)
    return (
        f"SELECT {columns} FROM rws_jobs{_claim_index_hint(vendor, queues)} WHERE status = 'pending' AND priority = %s "
        f"AND next_run_at <= %s{qsql} "
        f"ORDER BY next_run_at ASC, created_at ASC, id ASC LIMIT {limit}",
        [priority, now, *qparams],
    )


def claim_update(select: str, vendor: str) -> str:
    """The claim on PostgreSQL and SQLite: mark the rows ``select`` finds, in one statement."""
    lock = " FOR UPDATE SKIP LOCKED" if vendor == "postgresql" else ""
    return f"UPDATE rws_jobs SET {CLAIM_SET} WHERE id IN ({select}{lock}) RETURNING {CLAIM_COLUMNS}"


def top_priority_select(queues: Sequence[str] | None, below: int | None, vendor: str = "") -> tuple[str, list[Any]]:
    """The highest priority among pending jobs (below ``below``): one probe of the claim index."""
    qsql, qparams = _queue_filter(queues, vendor)
    bound, bparams = (" AND priority < %s", [below]) if below is not None else ("", [])
    return f"SELECT MAX(priority) FROM rws_jobs WHERE status = 'pending'{bound}{qsql}", [*bparams, *qparams]


def due_band_select(queues: Sequence[str] | None, below: int | None, now: int,
                    vendor: str = "") -> tuple[str, list[Any]]:
    """Read-only: the highest band (below ``below``) that holds a due job, in one statement.

    Walks the pending bands from the top, one probe of the claim index for the next band and one
    for a due job in it, and stops at the first band with a due job, at the last band, or after
    ``MAX_BAND_WALK`` bands. Returns one row (priority, due, passed): (p, true, ...) is the band
    to claim from; (NULL, ...) says nothing is due there; (p, false, ...) says the walk gave up
    at band p, and ``top_due_band_select`` below p finds the band; ``passed`` whether it passed
    bands that hold only future jobs. One round trip however many such bands there are: walking
    them one statement at a time, then scanning the due rows, made each claim take 8 ms on
    PostgreSQL with 2,000 due jobs below 20 such bands (measured).
    """
    bound, bparams = (" AND priority < %s", [below]) if below is not None else ("", [])
    if vendor == "mysql":
        return _due_band_select_mysql(queues, bound, bparams, now)
    qsql, qparams = _queue_filter(queues, vendor)
    # The due time of the band's first job in claim order, the first entry of its range: a scalar
    # subquery, which no planner turns into a join over every due row (PostgreSQL did that with
    # NOT EXISTS). In the claim's whole order, which only the claim index has: for MIN(next_run_at)
    # PostgreSQL chose the due index, filtering the band's priority over all pending rows.
    first = (f"(SELECT next_run_at FROM rws_jobs WHERE status = 'pending' AND priority = bands.p{qsql} "
             f"ORDER BY next_run_at, created_at, id LIMIT 1)")
    return (
        "WITH RECURSIVE bands (p, n) AS ("
        f"SELECT (SELECT MAX(priority) FROM rws_jobs WHERE status = 'pending'{bound}{qsql}), 1 "
        "UNION ALL "
        f"SELECT (SELECT MAX(priority) FROM rws_jobs WHERE status = 'pending' AND priority < bands.p{qsql}), n + 1 "
        f"FROM bands WHERE bands.p IS NOT NULL AND n < {MAX_BAND_WALK} AND {first} > %s) "
        f"SELECT p, {first} <= %s, n > 1 FROM bands ORDER BY n DESC LIMIT 1",
        [*bparams, *qparams, *qparams, *qparams, now, *qparams, now],
    )


def _due_band_select_mysql(queues: Sequence[str] | None, bound: str, bparams: list[Any],
                           now: int) -> tuple[str, list[Any]]:
    """due_band_select for MariaDB/MySQL, whose correlated MIN and MAX subqueries read the whole
    band (a walk over 20 bands of 5,000 future jobs took 700 ms, measured). A loose index scan
    instead: one index dive per band for its earliest due time. The status (and a single queue)
    is written as a range: with an equality MariaDB reads the index by ``ref``, every row."""
    if queues:
        index, group = "rws_jobs_queue_idx", "status, queue, priority"
        if _one_queue(queues):
            qsql, qparams = " AND queue >= %s AND queue <= %s", [queues[0], queues[0]]
        else:
            qsql, qparams = _queue_filter(queues)
    else:
        index, group, qsql, qparams = "rws_jobs_claim_idx", "status, priority", "", []
    due = "CASE WHEN first <= %s THEN priority END"
    return (
        f"SELECT MAX({due}), 1, MAX({due}) < MAX(priority) FROM (SELECT priority, MIN(next_run_at) AS first "
        f"FROM rws_jobs FORCE INDEX ({index}) WHERE status >= 'pending' AND status <= 'pending'{qsql}{bound} "
        f"GROUP BY {group}) AS bands",
        [now, now, *qparams, *bparams],
    )


def complete_delete(n: int) -> str:
    """Delete ``n`` finished jobs (ids, then the claim's token) that the claim still holds.

    By primary key: "(status = 'running') IS TRUE" is no index condition. With statistics that say
    few rows are running (taken while the table held pending jobs only), PostgreSQL read the claim
    index's 'running' entries instead, the deleted rows' too, ever more of them during a drain
    (1 ms instead of 0.1 ms a completion, measured).
    """
    return (f"DELETE FROM rws_jobs WHERE id IN ({', '.join(['%s'] * n)}) AND locked_by = %s "
            f"AND (status = 'running') IS TRUE")


def _claim_index_hint(vendor: str, queues: Sequence[str] | None = None) -> str:
    if vendor != "mysql":
        return ""
    return " FORCE INDEX (rws_jobs_queue_idx)" if _one_queue(queues) else " FORCE INDEX (rws_jobs_claim_idx)"


def _due_index_hint(vendor: str) -> str:
    # Planners that see "status = 'pending'" first may pick the claim index and read every pending
    # row; these two queries are only fast on the due index, which reads due rows only.
    return {"sqlite": " INDEXED BY rws_jobs_due_idx", "mysql": " FORCE INDEX (rws_jobs_due_idx)"}.get(vendor, "")


def _running_index_hint(vendor: str) -> str:
    """The lease statements have no index of their own (migration 0006): they read the 'running'
    range of a status-led index, the running jobs' rows. SQLite is told: its statistics (ANALYZE)
    give only the average rows per status, so with a million pending rows it read the whole table
    for recovery's ORDER BY locked_until instead (tests/test_explain.py). PostgreSQL and MariaDB
    know how few rows are running, and pick their index themselves."""
    return " INDEXED BY rws_jobs_due_idx" if vendor == "sqlite" else ""


def any_due_select(queues: Sequence[str] | None, now: int, vendor: str = "") -> tuple[str, list[Any]]:
    """Read-only: is any job due? One probe of the due index, however many bands there are."""
    qsql, qparams = _queue_filter(queues)
    return (f"SELECT 1 FROM rws_jobs{_due_index_hint(vendor)} WHERE status = 'pending' AND next_run_at <= %s{qsql} "
            f"LIMIT 1", [now, *qparams])


def top_due_band_select(queues: Sequence[str] | None, below: int | None, now: int,
                        vendor: str = "") -> tuple[str, list[Any]]:
    """The highest priority among due jobs: a scan of the due rows, for when walking the bands
    from the top would pass many that hold only future jobs."""
    qsql, qparams = _queue_filter(queues)
    bound, bparams = (" AND priority < %s", [below]) if below is not None else ("", [])
    due = (f"SELECT priority FROM rws_jobs{_due_index_hint(vendor)} WHERE status = 'pending' "
           f"AND next_run_at <= %s{bound}{qsql}")
    if vendor == "postgresql":
        # Left to itself PostgreSQL reads the claim index backwards for MAX, through every future
        # row of the bands above; OFFSET 0 keeps the due rows a query of their own.
        return f"SELECT MAX(priority) FROM ({due} OFFSET 0) AS due", [now, *bparams, *qparams]
    return due.replace("SELECT priority", "SELECT MAX(priority)", 1), [now, *bparams, *qparams]


def top_band_select(columns: str, queues: Sequence[str] | None, below: int | None, now: int,
                    limit: int, vendor: str = "") -> tuple[str, list[Any]]:
    """band_select for the highest band (below ``below``), found by a subquery in the same statement."""
    top_sql, top_params = top_priority_select(queues, below, vendor)
    select, params = band_select(columns, queues, 0, now, limit, vendor)
    return select.replace("priority = %s", f"priority = ({top_sql})", 1), [*top_params, *params[1:]]


def after_point(select: str, params: list[Any], point: tuple[Any, ...]) -> tuple[str, list[Any]]:
    """``select`` (a band_select or top_band_select) limited to rows after ``point``, a row's
    (priority, next_run_at, created_at, id): the range starts there instead of at the band's start.

    Written as ORs, which MariaDB's range optimizer turns into index ranges over all five columns
    (a row comparison it uses for next_run_at only). The point bounds only its own band; MariaDB
    drops "priority <> point's" once the band's subquery is known.
    """
    priority, next_run_at, created_at, job_id = point
    after = (" AND (priority <> %s OR next_run_at > %s OR (next_run_at = %s AND (created_at > %s "
             "OR (created_at = %s AND id > %s))))")
    order_at = select.index(" ORDER BY ")
    return (select[:order_at] + after + select[order_at:],
            [*params, priority, next_run_at, next_run_at, created_at, created_at, job_id])


def _roll_back(raw_cursor: Any) -> None:
    """End a failed transaction on a MariaDB/MySQL connection: read what the server still sends
    for the statements of the call that failed, then roll back (if the connection still works;
    if not, the caller's error says so and the connection is dropped)."""
    try:
        while raw_cursor.nextset():
            pass
    except Exception:
        pass
    try:
        raw_cursor.execute("ROLLBACK")
    except Exception:
        pass


_FORMAT = re.compile(r"(?<!%)%s")


@functools.lru_cache(maxsize=512)
def _qmark(sql: str) -> str:
    """Django's ``%s`` placeholders as sqlite3's ``?`` (what Django's SQLite cursor does for
    every statement; the worker's few statements are converted once each)."""
    return _FORMAT.sub("?", sql).replace("%%", "%")


class _DriverCursor:
    """The driver's cursor of a worker's own connection, taking Django's placeholders.

    Django's cursor wrapper costs more than the SQLite statements it runs for a claim: its query
    conversion, its query-log check and a new error wrapper for every fetch were a quarter of the
    dispatcher's time in a SQLite drain (measured). These connections run only this module's
    statements, so they use the driver's cursor. As a context manager (what Store._cursor
    returns) it turns the driver's errors into Django's, as ``wrap_database_errors`` does.
    """

    __slots__ = ("cursor", "_sqlite", "_errors")

    def __init__(self, cursor: Any, sqlite: bool, errors: Any):
        self.cursor = cursor
        self._sqlite = sqlite
        self._errors = errors

    def __enter__(self) -> "_DriverCursor":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Any:
        return self._errors.__exit__(exc_type, exc, tb)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.cursor.execute(_qmark(sql) if self._sqlite else sql, params)

    def fetchone(self) -> Any:
        return self.cursor.fetchone()

    def fetchall(self) -> Any:
        return self.cursor.fetchall()

    @property
    def rowcount(self) -> int:
        return self.cursor.rowcount


def _is_psycopg3() -> bool:
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    return is_psycopg3


class Store:
    """Queue statements on one connection (the thread's Django one, or a private one)."""

    def __init__(self, conn: BaseDatabaseWrapper):
        self.conn = conn
        self.vendor = conn.vendor
        # The worker's own PostgreSQL connections prepare the statements that run for every job
        # (claim, completion, renewal): planning was a third of a claim's time. Only where
        # private_connection() turned on server-side binding, so OPTIONS["server_side_binding"]
        # = False (behind a pooler that cannot keep prepared statements) turns this off too.
        self.prepare = (self.vendor == "postgresql" and getattr(conn, "rws_private", False)
                        and conn.settings_dict.get("OPTIONS", {}).get("server_side_binding") is True
                        and _is_psycopg3())
        # MariaDB/MySQL: where the last claim stopped, (priority, next_run_at, created_at, id), and
        # until when (time.monotonic()) the next claim may start there (see _claim_mysql).
        self._resume: tuple[Any, ...] | None = None
        self._resume_until = 0.0
        # The last band walk passed bands that hold only future jobs: the next claim walks first
        # too, instead of trying the top band (a claim that finds nothing) every time.
        self._walk_first = False
        self._writes = write_lock(conn)  # held around each write (see db.write_lock)
        self._kept: Any = None  # the private connection's cursor, once opened (see _cursor)

    def _cursor(self) -> AbstractContextManager[Any]:
        """A cursor for the next statements. On the worker's own connections one is kept for the
        Store's life (opening and closing one cost 27 us on SQLite, about a tenth of a no-op job's
        time in the worker), the driver's (see _DriverCursor); on Django's connections, a new one
        each time, closed after use.
        """
        if self._kept is None:
            if not getattr(self.conn, "rws_private", False):
                return self.conn.cursor()
            wrapper = self.conn.cursor()  # connects (and configures the connection) as Django does
            if self.vendor == "sqlite":  # Django's SQLite cursor converts placeholders itself, again
                wrapper.close()
                self._kept = _DriverCursor(self.conn.connection.cursor(), True, self.conn.wrap_database_errors)
            else:
                self._kept = _DriverCursor(wrapper.cursor, False, self.conn.wrap_database_errors)
        return self._kept

    def _atomic(self) -> AbstractContextManager[None]:
        """A short write transaction (see db.atomic), on the kept cursor where there is one."""
        return atomic(self.conn, cursor=self._cursor() if getattr(self.conn, "rws_private", False) else None)

    def _execute(self, c: Any, sql: str, params: list[Any]) -> None:
        """Run one of the hot statements, prepared where ``self.prepare`` says so."""
        if self.prepare:
            c.cursor.execute(sql, params, prepare=True)
        else:
            c.execute(sql, params)

    # -- claim ---------------------------------------------------------------------------------

    def finish_and_claim(
        self, finished: Sequence[Claimed], token: str, now: int, lease_until: int,
        queues: Sequence[str] | None, limit: int, probe_first: bool = False,
    ) -> tuple[set[str], list[Claimed]]:
        """``complete_many(finished)``, then ``claim(...)``; returns (ids deleted, jobs claimed).

        On SQLite both are one transaction: SQLite runs one writer at a time anyway, and a commit
        and a turn at the write lock fewer per batch made the drain faster (see Worker.riding).
        """
        if self.vendor == "sqlite" and finished:
            with self._writes, self._atomic():
                done = self.complete_many(finished)
                return done, self.claim(token, now, lease_until, queues, limit, probe_first)
        done = self.complete_many(finished) if finished else set()
        return done, self.claim(token, now, lease_until, queues, limit, probe_first)

    def claim(
        self, token: str, now: int, lease_until: int, queues: Sequence[str] | None, limit: int,
        probe_first: bool = False,
    ) -> list[Claimed]:
        """Atomically take up to ``limit`` due jobs, in queue order, leased to ``token``.

        Jobs are taken priority band by priority band, highest first: the claim index
        ``(status, priority, next_run_at, created_at, id)`` makes each band a range that stops at
        LIMIT, so neither many due rows (no sort) nor many future rows (they lie past the range)
        slow a claim down. A busy queue's claim finds its band by a subquery (one statement);
        when that band has nothing due, one read-only walk finds the next band with a due job,
        however many bands above it hold only future jobs (see due_band_select).
        """
        set_params = [token, lease_until, now]
        taken: list[tuple] = []
        below: int | None = None  # the next claim looks at bands below this one
        band: int | None = None  # a band the band walk found with a due job
        columns = CLAIM_COLUMNS if self.vendor == "mysql" else "id"
        with self._writes, self._cursor() as c:
            if probe_first and not _one_queue(queues):
                # (One queue: the band walk below probes that queue's ranges; the due index
                # would read other queues' due rows first.)
                c.execute(*any_due_select(queues, now, self.vendor))
                if c.fetchone() is None:
                    return []
            probe_first = probe_first or self._walk_first
            while len(taken) < limit:
                if probe_first:
                    band = self._due_band(c, queues, below, now)
                    if band is None:
                        break
                    probe_first = False
                want = limit - len(taken)
                if band is None:
                    # The band is found by a subquery of the claim itself: one statement when the
                    # top band has due jobs, which is the steady state of a busy queue.
                    select, params = top_band_select(columns, queues, below, now, want, self.vendor)
                else:
                    select, params = band_select(columns, queues, band, now, want, self.vendor)
                if self.vendor == "mysql":
                    rows = self._claim_mysql(set_params, select, params, want,
                                             self._resume_point(queues) if below is None and band is None else None)
                    if rows:
                        self._keep_resume_point(queues, rows[-1])
                else:
                    self._execute(c, claim_update(select, self.vendor), [*set_params, *params])
                    # RETURNING does not keep the subquery's order.
                    rows = sorted(c.fetchall(), key=lambda r: (r[7], r[8], r[0]))
                if rows:
                    taken += rows
                    below = rows[0][4]
                elif band is not None:
                    below = band  # others took its due jobs meanwhile: look below it
                # Short: the band had fewer due jobs than wanted, or none (the top band may hold
                # only future jobs): walk the bands below to the next one with a due job.
                band = None
                probe_first = True
        return [Claimed(*row, token=token) for row in taken]

    def _due_band(self, c: Any, queues: Sequence[str] | None, below: int | None, now: int) -> int | None:
        """The highest band below ``below`` with a due job (see due_band_select), or None."""
        self._execute(c, *due_band_select(queues, below, now, self.vendor))
        top, due, passed = c.fetchone()
        if below is None:
            self._walk_first = bool(passed) and top is not None
        if top is None or due:
            return top
        # The walk passed MAX_BAND_WALK bands that hold only future jobs: read the due rows.
        c.execute(*top_due_band_select(queues, top, now, self.vendor))
        return c.fetchone()[0]

    def _resume_point(self, queues: Sequence[str] | None) -> tuple[Any, ...] | None:
        # Not with a queue filter: then MariaDB cannot know the top band when it plans the claim
        # (the subquery must read rows), and the point would not bound the range.
        if queues or self._resume is None or time.monotonic() >= self._resume_until:
            return None
        return self._resume

    def _keep_resume_point(self, queues: Sequence[str] | None, row: tuple) -> None:
        if queues:
            return
        if self._resume is None or time.monotonic() >= self._resume_until:
            self._resume_until = time.monotonic() + RESUME_SECONDS  # from a claim that began at the start
        self._resume = (row[4], row[7], row[8], row[0])

    def _claim_mysql(self, set_params: list[Any], select: str, params: list[Any], want: int,
                     resume: tuple[Any, ...] | None) -> list[tuple]:
        """No UPDATE ... RETURNING here: lock the band's first free rows, mark them, commit.

        The band is read in index order with no sort, so InnoDB locks only the rows LIMIT returns
        (a sorted FOR UPDATE would lock every row it read first) and SKIP LOCKED passes over rows
        another worker holds.

        ``resume`` (where this Store's last claim stopped) starts the range after the rows claimed
        a moment ago: InnoDB keeps their index entries, delete-marked, until its purge gets to
        them, and a locking read from the band's start visits each (measured: 2,000 pages read
        to lock 4 rows during a drain, 10 from the resume point). Rows that sort before the
        point (a job handed back, or enqueued with a due time in the past) are found when a
        resumed claim comes back short, which looks from the band's start too, and at the
        latest after RESUME_SECONDS, when a claim starts from the beginning again.
        """
        if is_registered(self.conn):  # tick(): the caller's connection, perhaps inside its transaction
            with atomic(self.conn), self.conn.cursor() as c:
                return self._lock_and_mark(c, False, set_params, select, params, want, resume)
        c = self._cursor()  # (connects first: sends_several asks the driver's connection)
        if not sends_several(self.conn):  # PyMySQL: one statement per call
            with self._atomic():
                return self._lock_and_mark(c, False, set_params, select, params, want, resume)
        # The worker's own connection: BEGIN goes with the first statement and COMMIT with the
        # last, so a claim is two round trips instead of four (drain 2,740 -> 3,200 jobs/s).
        with c:
            try:
                return self._lock_and_mark(c.cursor, True, set_params, select, params, want, resume)
            except BaseException:
                _roll_back(c.cursor)
                raise

    def _lock_and_mark(self, c: Any, own: bool, set_params: list[Any], select: str, params: list[Any],
                       want: int, resume: tuple[Any, ...] | None) -> list[tuple]:
        """The claim's transaction; with ``own``, it begins with the first statement and commits
        with the last (``c`` is then the driver's cursor)."""
        locking = " FOR UPDATE SKIP LOCKED"

        def first(sql: str, sql_params: list[Any]) -> list[tuple]:
            c.execute(("BEGIN; " if own else "") + sql + locking, sql_params)
            if own:
                c.nextset()
            return list(c.fetchall())

        if resume is not None:
            rows = first(*after_point(select, params, resume))
            if len(rows) < want:  # rows before the point too; locks held twice are ours
                self._resume = None
                c.execute(select + locking, params)
                seen = {r[0] for r in rows}
                rows += [r for r in c.fetchall() if r[0] not in seen]
                rows.sort(key=lambda r: (-r[4], r[7], r[8], r[0]))
                rows = rows[:want]
        else:
            rows = first(select, params)
        if rows:
            c.execute(f"UPDATE rws_jobs SET {CLAIM_SET} WHERE id IN ({', '.join(['%s'] * len(rows))})"
                      + ("; COMMIT" if own else ""), [*set_params, *(r[0] for r in rows)])
            if own:
                while c.nextset():
                    pass
        elif own:
            c.execute("COMMIT")
        return rows

    def complete_many(self, jobs: Sequence[Claimed]) -> set[str]:
        """Delete finished jobs in one statement per claim; return the ids this worker still held."""
        by_token: dict[str, list[str]] = {}
        for job in jobs:
            by_token.setdefault(job.token, []).append(job.id)
        done: set[str] = set()
        returning = self.vendor != "mysql" or getattr(self.conn, "mysql_is_mariadb", False)
        with self._writes, self._cursor() as c:
            for token, ids in by_token.items():
                sql = complete_delete(len(ids))
                if returning:
                    self._execute(c, sql + " RETURNING id", [*ids, token])
                    done.update(r[0] for r in c.fetchall())
                else:  # MySQL has no DELETE ... RETURNING: lock what is still ours, then delete it
                    held = (f"SELECT id FROM rws_jobs WHERE status = 'running' AND locked_by = %s "
                            f"AND id IN ({', '.join(['%s'] * len(ids))}) FOR UPDATE")
                    with self._atomic():
                        c.execute(held, [token, *ids])
                        mine = [r[0] for r in c.fetchall()]
                        if mine:
                            c.execute(f"DELETE FROM rws_jobs WHERE id IN ({', '.join(['%s'] * len(mine))})", mine)
                    done.update(mine)
        return done

    # -- outcomes (each fenced on the claim's token) ---------------------------------------------

    def _fenced(self, sql: str, params: list[Any], job: Claimed, expired_before: int | None = None) -> bool:
        """Apply ``sql`` only while ``job.token`` still holds the row (and, for recovery, only
        while its lease is still expired: a holder that renewed in time keeps it)."""
        where = " WHERE id = %s AND status = 'running' AND locked_by = %s"
        params = [*params, job.id, job.token]
        if expired_before is not None:
            where += " AND locked_until < %s"
            params.append(expired_before)
        with self._writes, self._cursor() as c:
            c.execute(sql + where, params)
            return c.rowcount == 1

    def complete(self, job: Claimed) -> bool:
        return self._fenced("DELETE FROM rws_jobs", [], job)

    def reschedule(
        self, job: Claimed, attempts: int, error: str, tb: str | None, next_run_at: int,
        expired_before: int | None = None,
    ) -> bool:
        return self._fenced(
            "UPDATE rws_jobs SET status = 'pending', attempts = %s, last_error = %s, traceback = %s, "
            "next_run_at = %s, locked_by = NULL, locked_until = NULL",
            [attempts, error, tb, next_run_at],
            job,
            expired_before,
        )

    def bury(
        self, job: Claimed, attempts: int, error: str, tb: str | None, now: int,
        expired_before: int | None = None,
    ) -> bool:
        """Move to the dead-letter list; a failed job no longer holds its unique key."""
        return self._fenced(
            "UPDATE rws_jobs SET status = 'failed', attempts = %s, last_error = %s, traceback = %s, "
            "failed_at = %s, unique_hash = NULL, locked_by = NULL, locked_until = NULL",
            [attempts, error, tb, now],
            job,
            expired_before,
        )

    def release(self, job: Claimed) -> bool:
        """Hand a job back unrun (graceful shutdown): pending again, no attempt charged."""
        return self._fenced(
            "UPDATE rws_jobs SET status = 'pending', locked_by = NULL, locked_until = NULL", [], job
        )

    # -- leases ----------------------------------------------------------------------------------

    def renew(self, tokens: Sequence[str], until: int) -> int:
        if not tokens:
            return 0
        with self._writes, self._cursor() as c:
            self._execute(c, f"UPDATE rws_jobs{_running_index_hint(self.vendor)} SET locked_until = %s "
                             f"WHERE status = 'running' AND locked_by IN ({', '.join(['%s'] * len(tokens))})",
                          [until, *tokens])
            return c.rowcount

    def _seed_marker_sql(self) -> str:
        parts = [f"'{SEED_MARKER}'", "attempts", "':'", "next_run_at"]
        return f"CONCAT({', '.join(parts)})" if self.vendor == "mysql" else " || ".join(parts)

    def lease_leaseless(self, now: int, until: int) -> int:
        """Give running rows that carry no lease (a seed writer's claim) one, so they are taken
        back only if nobody finishes them within a lease: a live Rust worker may be running them.

        The lease is marked ``seed:<attempts>:<next_run_at>``: a seed writer never touches our
        columns, so when it retries the job and claims it again the row still carries this old,
        expired lease; the changed attempts or due time tell ``relet_seed_claims`` it is a new
        claim, which gets a fresh lease instead of being taken from a worker that is alive.
        """
        with self._writes, self._cursor() as c:
            c.execute(
                f"UPDATE rws_jobs{_running_index_hint(self.vendor)} "
                f"SET locked_until = %s, locked_by = {self._seed_marker_sql()} "
                "WHERE status = 'running' AND locked_until IS NULL",
                [until],
            )
            return c.rowcount

    def relet_seed_claims(self, now: int, until: int) -> int:
        """Fresh leases for seed claims whose marker no longer matches the row (see above)."""
        with self._writes, self._cursor() as c:
            c.execute(
                f"UPDATE rws_jobs{_running_index_hint(self.vendor)} "
                f"SET locked_until = %s, locked_by = {self._seed_marker_sql()} "
                f"WHERE status = 'running' AND locked_until < %s AND locked_by LIKE %s "
                f"AND locked_by <> {self._seed_marker_sql()}",
                [until, now, SEED_MARKER.replace("%", "") + "%"],
            )
            return c.rowcount

    def expired(self, now: int, limit: int) -> list[Claimed]:
        """Running jobs whose lease ran out, with the token that held them."""
        with self._cursor() as c:
            c.execute(
                f"SELECT {CLAIM_COLUMNS}, locked_by FROM rws_jobs{_running_index_hint(self.vendor)} "
                f"WHERE status = 'running' AND locked_until < %s ORDER BY locked_until LIMIT %s",
                [now, limit],
            )
            rows = c.fetchall()
        return [Claimed(*row[:-1], token=row[-1]) for row in rows]


__all__ = ["Claimed", "Store", "Status", "atomic"]
