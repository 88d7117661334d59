"""What every database's backend does the same way, and the hooks where they differ.

A backend belongs to one Django connection (``backend_for(conn)`` keeps it on the connection), as
Django's ``connection.ops`` and ``connection.features`` do. Its ``features`` say what the database
can do; its statements (``Statements``) are the queue's SQL; its session set-up is what the queue's
connections need; the claim algorithm below runs on every database, with hooks.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Protocol

from django.db import DatabaseError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from ...conf import jobs_settings
from .claimed import CLAIM_COLUMNS, Claimed
from .cursors import DriverCursor
from .horizon import Horizon
from .inserts import insert_multirow
from .statements import DELETED_RETURNING, Sql, Statements, band_order_key, one_queue

#: Member rows per INSERT (two parameters each: within SQLite's 999 of old builds).
MEMBERS_PER_INSERT = 400
#: How long claims keep starting at a resume point before one starts from its band's start again
#: (see BaseBackend.resume_point).
RESUME_SECONDS = 1.0


class Store(Protocol):
    """What a claim uses of the ``queue.store.Store`` that calls it. A protocol, so that this
    part does not import the queue part above it (tests/test_imports.py)."""

    writes: AbstractContextManager[Any]
    walk_first: bool
    resume: tuple[Any, ...] | None
    resume_until: float
    resume_queues: tuple[str, ...] | None
    resuming_until: float
    start_claim_took: float

    def cursor(self) -> AbstractContextManager[Any]: ...

    def atomic(self) -> AbstractContextManager[None]: ...

    def execute(self, c: Any, sql: str, params: list[Any]) -> None: ...


def idle_transaction_seconds() -> int:
    """How long the server lets a transaction of the worker's own sessions sit idle (no statement
    under way) before it ends the session, rolling the transaction back: a lease (LEASE_SECONDS),
    at least a second. The worker's transactions send their statements back to back, so only a
    client that is gone (a partition, a frozen host) reaches it; its locks are then freed within
    about a lease instead of the server's wait_timeout, hours (docs/explanation/guarantees.md;
    tests/test_dead_connections.py::test_a_worker_cut_off_inside_a_transaction_holds_nothing_past_a_lease)."""
    return max(1, math.ceil(float(jobs_settings.LEASE_SECONDS)))


def is_registered(conn: BaseDatabaseWrapper) -> bool:
    """True for the calling thread's own Django connection to conn.alias."""
    # The worker's own connections never are, and asking ``connections`` (a thread-critical
    # local) cost more than a SQLite claim's statements.
    return not getattr(conn, "rws_private", False) and connections[conn.alias] is conn


class BaseFeatures:
    """What a database can do, as the queue uses it (Django's ``DatabaseFeatures``)."""

    #: One writer at a time holds the whole database (SQLite): a write transaction sees no other
    #: writer between its reads and its writes.
    serializes_writes = False
    #: The dispatcher deletes succeeded jobs with its next claim: in the claim's transaction (one
    #: writer at a time: SQLite), or with ``deletes_in_claim_query`` in the claim's own query.
    deletes_with_claim = False
    #: The deletions are sent in the claim's simple query, one implicit transaction and one round
    #: trip (PostgreSQL with psycopg 3: ScopedCursor.defer).
    deletes_in_claim_query = False
    #: How an idle worker learns of new jobs: "listen" (LISTEN/NOTIFY), "data_version" (SQLite's
    #: PRAGMA data_version) or "poll".
    wakeup = "poll"
    #: A claim starts after the row the last one took (see BaseBackend.resume_point).
    resumes_claims = False
    #: ... also when it filters by queue (MariaDB cannot bound the range by the point then).
    resumes_with_queue_filter = False
    #: A COMMIT that raised may have been applied all the same: the server may have committed
    #: before the connection died (SQLite, in the process, knows).
    failed_commit_may_have_committed = True
    #: What enqueue_many uses while no execute wrapper watches: "copy", "pipelined" or "multirow".
    bulk_insert = "multirow"
    #: DELETE ... RETURNING.
    can_return_deleted = True
    #: The most parameters one statement may take (None: no limit the queue meets).
    max_query_params: int | None = None
    #: Appended to the unique-key lookup to read the latest commit under a lock ("" for none).
    shared_lock = ""
    #: Appended to a SELECT to lock its row for an update ("" where the transaction locks the file).
    row_lock = ""
    #: The driver connection takes several statements in one call (asked of the open connection).
    sends_several_statements = False
    #: A rust-web-server table is adopted by rebuilding it in the migration's transaction, as
    #: Django's own SQLite schema editor alters tables (adopt.py; tests/test_adopt.py).
    adopts_by_rebuild = False
    #: A statement that reads the server's clock as unix seconds, or None where the database
    #: lives in the host's clock (SQLite): see clock.py.
    server_clock_sql: str | None = None

    def __init__(self, conn: BaseDatabaseWrapper):
        self.conn = conn


class BaseBackend(Statements):
    features_class = BaseFeatures

    def __init__(self, conn: BaseDatabaseWrapper):
        self.conn = conn
        self.features = self.features_class(conn)
        self._kept: dict[tuple[Any, ...], Sql] = {}  # see claim_select

    # -- session set-up ---------------------------------------------------------------------------

    def configure_session(self) -> None:
        """Set up a new connection (called on Django's connection_created). The worker's own
        connections (``rws_private``) bound their idle transactions here where the database
        keeps the bound per session (idle_transaction_seconds)."""

    def is_in_memory(self) -> bool:
        """The database lives in this connection alone (SQLite's in-memory database): no other
        connection sees what it writes."""
        return False

    def deadlocked(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the database's deadlock error: the transaction was rolled back
        whole, and one that is all the caller's own may run again (api/enqueue_once.py)."""
        return False

    def holds_write_lock(self) -> bool:
        """Whether the connection's open transaction holds the database's one write lock (where
        one writer at a time holds the whole database, and transactions take it at BEGIN):
        another connection's write would wait for it."""
        return False

    def before_first_connection(self) -> None:
        """Called once at start-up (AppConfig.ready) on the main thread's connection to each alias
        the queue sets up, before anything connects: what must be known before configure_session
        changes how the connection behaves."""

    def private_options(self, options: dict[str, Any]) -> dict[str, Any]:
        """The OPTIONS of a worker's own connection (db.private_connection), from the project's."""
        return options

    def begin_sql(self, write: bool) -> str:
        """The statement that begins a short transaction (db.atomic)."""
        return "BEGIN"

    @contextmanager
    def atomic(self, *, write: bool = True, cursor: Any = None) -> Iterator[None]:
        """A short transaction (a savepoint inside the caller's, on Django's connection).

        ``cursor``: a context manager that gives the cursor to send BEGIN and COMMIT with (a
        Store's kept one); by default a new cursor of the connection.
        """
        conn = self.conn
        if is_registered(conn):
            with transaction.atomic(using=conn.alias):
                yield
            return
        with cursor if cursor is not None else conn.cursor() as c:
            c.execute(self.begin_sql(write))
            try:
                yield
            except BaseException:
                c.execute("ROLLBACK")
                raise
            c.execute("COMMIT")

    def write_lock(self) -> AbstractContextManager[Any]:
        """What the worker's own connections hold around their writes (nothing but on SQLite)."""
        return nullcontext()

    def prepares_statements(self) -> bool:
        """Whether the Store prepares the statements that run for every job on this connection."""
        return False

    def driver_cursor(self) -> DriverCursor:
        """The cursor a Store keeps on a worker's own connection (see cursors.DriverCursor)."""
        wrapper = self.conn.cursor()  # connects (and configures the connection) as Django does
        return DriverCursor(wrapper.cursor, False, self.conn.wrap_database_errors)

    def check(self) -> list[Any]:
        """System check messages for this database (checks.check_database)."""
        return []

    # -- reads with a time limit ------------------------------------------------------------------

    @contextmanager
    def time_limit(self, seconds: float) -> Iterator[None]:
        """Statements run inside fail past ``seconds`` (an error is_time_limit_error knows); the
        base backend sets no limit."""
        yield

    def is_time_limit_error(self, exc: BaseException) -> bool:
        return False

    def count_within(self, rows: Any, seconds: float) -> int | None:
        """``rows.count()`` (a queryset on this connection), or None when the database takes longer
        than ``seconds`` (tests/test_admin_input.py::test_a_count_stops_at_its_time_limit)."""
        try:
            with self.time_limit(seconds), transaction.atomic(using=self.conn.alias):
                return int(rows.count())
        except DatabaseError as exc:
            if self.is_time_limit_error(exc):
                return None
            raise

    # -- locks that claims skip -------------------------------------------------------------------

    def locked_due(self, before: int, limit: int) -> list[tuple[str, str]]:
        """The pending jobs due at ``before`` or earlier (of the ``limit`` due longest) that a
        transaction holds locked now, as (id, queue): every claim's SKIP LOCKED passes them over.

        Read on this (Django's) connection: the rows, then the same rows ``FOR UPDATE SKIP
        LOCKED`` in a transaction rolled back at once; those missing from the second are locked.
        The due index's range, stopped by its LIMIT: off the per-job path (rws_health, the
        metrics endpoint). None where a transaction locks the whole database (SQLite)
        (tests/test_health.py::test_a_due_job_a_transaction_keeps_locked_is_unhealthy)."""
        if not self.features.row_lock:
            return []
        rows = (
            f"SELECT id, queue FROM rws_jobs{self.due_index_hint()} WHERE status = 'pending' "
            f"AND next_run_at <= %s ORDER BY next_run_at LIMIT {int(limit)}"
        )
        with self.conn.cursor() as c:
            c.execute(rows, [before])
            every = [(row[0], row[1]) for row in c.fetchall()]
            if not every:
                return []
            with transaction.atomic(using=self.conn.alias):
                c.execute(rows + self.features.row_lock + " SKIP LOCKED", [before])
                free = {row[0] for row in c.fetchall()}
                transaction.set_rollback(True, using=self.conn.alias)
        return [row for row in every if row[0] not in free]

    # -- what holds back the cleanup of the queue's table -----------------------------------------

    def horizon(self) -> Horizon:
        """The oldest snapshot that holds back the cleanup of the queue's table, its holder and
        what waits to be cleaned up, read on this (Django's) connection (database/backends/
        horizon.py); the base backend measures nothing."""
        return Horizon()

    # -- the public API's statements --------------------------------------------------------------

    def insert_many(
        self, c: Any, rows: Iterator[list[Any]], batch_size: int, where: Callable[[], str], watched: bool
    ) -> None:
        """enqueue_many's rows through Django's cursor ``c``; ``watched`` while execute wrappers or
        the query log see the statements (each must then go through ``c``)."""
        insert_multirow(c, rows, batch_size, self.features.max_query_params)

    def insert_members(self, c: Any, batch_id: str, job_ids: Sequence[str], watched: bool) -> None:
        """A batch's member rows (workflows/members.py), ``members_per_insert()`` a statement
        through ``c``."""
        size = self.members_per_insert()
        for start in range(0, len(job_ids), size):
            part = job_ids[start : start + size]
            c.execute(
                "INSERT INTO rws_batch_members (job_id, batch_id) VALUES "
                + ", ".join(["(%s, %s)"] * len(part)),
                [v for job_id in part for v in (job_id, batch_id)],
            )

    def members_per_insert(self) -> int:
        """Member rows in one INSERT (insert_members)."""
        return MEMBERS_PER_INSERT

    def check_insert_size(self, params: list[Any], what: str) -> None:
        """Refuse a job whose INSERT the server would refuse for its size (ValueError)."""

    def exact_id(self, rows: Any, job_id: str) -> Any:
        """``rows`` (a queryset filtered by id) limited to the id's exact bytes."""
        return rows

    # -- the claim --------------------------------------------------------------------------------

    def claim(
        self,
        store: Store,
        token: str,
        now: int,
        lease_until: int,
        queues: Sequence[str] | None,
        limit: int,
        probe_first: bool = False,
    ) -> list[Claimed]:
        """Atomically take up to ``limit`` due jobs, in queue order, leased to ``token``.

        Jobs are taken priority band by priority band, highest first: the claim index makes each
        band a range that stops at LIMIT, so neither many due rows (no sort) nor many future rows
        (they lie past the range) slow a claim down. A busy queue's claim finds its band by a
        subquery (one statement); when that band has nothing due, one read-only walk finds the
        next band with a due job, however many bands above it hold only future jobs (see
        Statements.due_band_select).
        """
        with store.writes, store.cursor() as c:
            if probe_first and not one_queue(queues):
                # (One queue: the band walk below probes that queue's ranges; the due index
                # would read other queues' due rows first.)
                c.execute(*self.any_due_select(queues, now))
                if c.fetchone() is None:
                    return []
            return self.claim_bands(
                store, c, token, lease_until, now, queues, limit, [], None, probe_first or store.walk_first
            )

    def claim_bands(
        self,
        store: Store,
        c: Any,
        token: str,
        lease_until: int,
        now: int,
        queues: Sequence[str] | None,
        limit: int,
        taken: list[Claimed],
        below: int | None,
        probe_first: bool,
    ) -> list[Claimed]:
        """``claim``'s band by band loop on cursor ``c``: ``taken`` so far, the bands below
        ``below`` (None: all) left to look at, and whether to walk to the next band with a due job
        before the first claim (``probe_first``) or to try the top band at once."""
        band: int | None = None  # a band the band walk found with a due job
        while len(taken) < limit:
            if probe_first:
                band = self.find_band(store, c, queues, below, now)
                if band is None:
                    break
                probe_first = False
            want = limit - len(taken)
            rows = self.claim_band(store, c, token, lease_until, now, queues, below, band, want)
            if rows:
                taken += rows
                below = rows[0].priority
            elif band is not None:
                below = band  # others took its due jobs meanwhile: look below it
            # Short: the band had fewer due jobs than wanted, or none (the top band may hold
            # only future jobs): walk the bands below to the next one with a due job.
            band = None
            probe_first = True
        return taken

    def resume_point(self, store: Store, queues: Sequence[str] | None) -> tuple[Any, ...] | None:
        """Where a claim from the top starts: after the row the Store's last claim took, as
        (priority, next_run_at, created_at, id), or None to start at the band's start.

        Every claim leaves the index entries of the rows it took behind it, dead but kept until
        vacuum (PostgreSQL) or purge (InnoDB) removes them, which an old snapshot or read view
        holds back; a claim from the band's start visits each, a resumed one seeks past them
        (tests/test_explain.py test_a_resumed_claim_starts_at_its_point_past_dead_entries). Rows
        that sort before the point (a job handed back or recovered, one enqueued with a due
        time in the past, a waiting job promoted, a transaction that commits late) are found
        by the backend's resumed claim when it comes back short (MySQLBackend.claim_band looks
        from the band's start; PostgreSQLBackend.claim looks back LOOK_BACK seconds), and by the
        claim from the band's start once the point expires (``store.resume_until``).
        """
        if queues and not self.features.resumes_with_queue_filter:
            return None
        served = tuple(queues) if queues else None
        if store.resume_queues != served:
            # Made under another queue filter (a queue paused or resumed since), the point says
            # nothing of the rows of this one: a resumed queue's jobs sort before it
            # (tests/test_tick.py test_a_point_made_under_another_queue_filter_is_dropped).
            store.resume, store.resume_queues = None, served
        if store.resume is None or time.monotonic() >= store.resume_until:
            return None
        return store.resume

    def keep_resume_point(self, store: Store, queues: Sequence[str] | None, job: Claimed) -> None:
        """The next claim from the top resumes after ``job``, the last row a claim took."""
        if queues and not self.features.resumes_with_queue_filter:
            return
        if store.resume is None or time.monotonic() >= store.resume_until:
            store.resume_until = time.monotonic() + RESUME_SECONDS  # from a claim that began at the start
        store.resume = (job.priority, job.next_run_at, job.created_at, job.id)

    def claim_band(
        self,
        store: Store,
        c: Any,
        token: str,
        lease_until: int,
        now: int,
        queues: Sequence[str] | None,
        below: int | None,
        band: int | None,
        want: int,
    ) -> list[Claimed]:
        """Claim up to ``want`` due jobs of ``band`` (None: the top band below ``below``), in claim
        order: one UPDATE ... RETURNING."""
        return self.mark(
            store,
            c,
            self.claim_select(self.claim_key, queues, below, band, now, want),
            token,
            lease_until,
            now,
        )

    def mark(
        self, store: Store, c: Any, select: Sql, token: str, lease_until: int, now: int, locks: bool = False
    ) -> list[Claimed]:
        """Mark the rows ``select`` finds (and ``locks`` itself, or not) as claimed by ``token``,
        in one UPDATE ... RETURNING; return them in claim order."""
        store.execute(c, *self.claim_update(select, token, lease_until, now, locks))
        rows = [Claimed.from_row(row, token) for row in c.fetchall()]
        rows.sort(key=band_order_key)  # RETURNING does not keep the subquery's order
        return rows

    def claim_select(
        self,
        columns: str,
        queues: Sequence[str] | None,
        below: int | None,
        band: int | None,
        now: int,
        want: int,
        after: tuple[Any, ...] | None = None,
    ) -> Sql:
        """``band_select`` for the band ``band`` (None: the top band below ``below``), after the
        point ``after``, kept for the claims that follow within the same second: a busy queue's
        claims repeat it. With a point (new at every claim), its range (band_range) is kept. What
        is kept is never changed (claim_update and band_end copy it)."""
        key = (columns, tuple(queues) if queues else None, below, band, now, want if after is None else 0)
        kept = self._kept.get(key)
        if kept is None:
            if len(self._kept) >= 64:
                self._kept.clear()
            in_band = self.in_top_band(queues, below) if band is None else self.in_band(band)
            kept = self.band_range(columns, queues, in_band, now)
            if after is None:
                kept = self.band_end(kept, want)
            self._kept[key] = kept
        return kept if after is None else self.band_end(kept, want, after)

    def find_band(
        self, store: Store, c: Any, queues: Sequence[str] | None, below: int | None, now: int
    ) -> int | None:
        """The highest band below ``below`` with a due job (see due_band_select), or None."""
        store.execute(c, *self.due_band_select(queues, below, now))
        top, due, passed = c.fetchone()
        if below is None:
            store.walk_first = bool(passed) and top is not None
        if top is None or due:
            return top
        # The walk passed MAX_BAND_WALK bands that hold only future jobs: read the due rows.
        c.execute(*self.top_due_band_select(queues, top, now))
        return c.fetchone()[0]

    # -- completions ------------------------------------------------------------------------------

    def delete_finished(
        self, store: Store, c: Any, token: str, ids: list[str], metadata: bool = False
    ) -> list[tuple[Any, ...]]:
        """Delete the finished jobs ``ids`` that ``token`` still holds; return those deleted, each
        as (id, batch_id, has_dependents), as the deletion found them (batches.py, dependencies.py),
        and with ``metadata`` their metadata last (a task's result keeps it: tasks/outcomes.py)."""
        returning = DELETED_RETURNING + (", metadata" if metadata else "")
        store.execute(c, *self.complete_delete(ids, token).add(returning))
        return c.fetchall()

    def rust_claim_marker_sql(self, marker: str) -> str:
        """``<marker><attempts>:<next_run_at>``, the lease given to a rust-web-server claim."""
        return self.concat(f"'{marker}'", "attempts", "':'", "next_run_at")


__all__ = ["CLAIM_COLUMNS", "BaseBackend", "BaseFeatures"]
