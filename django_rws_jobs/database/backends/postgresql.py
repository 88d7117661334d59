"""PostgreSQL: claims with FOR UPDATE SKIP LOCKED, prepared hot statements, COPY for bulk enqueues."""

from __future__ import annotations

import functools
import itertools
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import cached_property
from typing import Any

from django.db import transaction

from ...conf import jobs_settings
from . import horizon
from .base import BaseBackend, BaseFeatures, Store, idle_transaction_seconds
from .claimed import CLAIM_COLUMNS, Claimed
from .cursors import PLACEHOLDER, DriverCursor
from .inserts import COPY_SQL
from .statements import BAND_ORDER_ASC, CLAIM_SET, Sql, band_order_key, placeholders, queue_filter

#: A batch's member rows, streamed (workflows/members.py).
MEMBERS_COPY_SQL = "COPY rws_batch_members (job_id, batch_id) FROM STDIN"

#: The SQLSTATE of a statement stopped by statement_timeout.
QUERY_CANCELED = "57014"


#: The worker's settings, for the transaction of each of its statements only (see ScopedCursor).
#: The worker's statements are all ranges of an index that already has their order, and some are
#: prepared. A plan made once for any parameters while the table held a few rows would read the
#: whole table once it holds a million, and with statistics from before a burst of enqueues the
#: claim read every due row and sorted them. Without sequential scans and sorts the planner keeps
#: to the claim index whatever the table's size and statistics (tests/test_explain.py). A plan
#: that must sort anyway (the band walk's last row) is then priced above jit_above_cost: JIT is
#: off, or PostgreSQL would compile it, many times the statement's own time.
PLANNER_SETTINGS = {
    "enable_seqscan": "off",
    "enable_sort": "off",
    "enable_incremental_sort": "off",
    "jit": "off",
}


def prologue() -> str:
    """The statement that gives a transaction the worker's settings (set_config(..., true) lasts
    until the transaction ends). Claims and outcomes need not wait for the WAL flush unless
    WORKER_SYNCHRONOUS_COMMIT: a database crash can only undo the last of them, and an undone
    claim or outcome makes a job run again (the at-least-once promise), never lose it."""
    settings = dict(PLANNER_SETTINGS)
    if not jobs_settings.WORKER_SYNCHRONOUS_COMMIT:
        settings["synchronous_commit"] = "off"
    return "SELECT " + ", ".join(f"set_config('{k}', '{v}', true)" for k, v in settings.items())


def transaction_bound() -> str:
    """The statement a ScopedCursor sends with each BEGIN: the server ends the session of a
    transaction left idle longer than idle_transaction_seconds() (a client gone between two round
    trips), freeing its locks. SET LOCAL, for that transaction only, as the prologue: a transaction
    pooler's server connection keeps no session setting of the worker's
    (tests/test_dead_connections.py::test_a_worker_cut_off_inside_a_transaction_holds_nothing_past_a_lease)."""
    return f"SET LOCAL idle_in_transaction_session_timeout = '{idle_transaction_seconds()}s'"


def behind_transaction_pooler(settings_dict: dict[str, Any]) -> bool:
    """Whether the connections of ``settings_dict`` go through a pooler in transaction mode:
    RWS_JOBS["POOLER"], else Django's DISABLE_SERVER_SIDE_CURSORS (which Django's docs ask of
    such projects)."""
    pooler = jobs_settings.POOLER
    if pooler is None:
        return bool(settings_dict.get("DISABLE_SERVER_SIDE_CURSORS"))
    return pooler == "transaction"


def _is_psycopg3() -> bool:
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    return is_psycopg3


#: libpq's TCP settings on the worker's own connections (docs/design.md, "Dead connections"):
#: an unanswered connect fails after 10 s, an idle connection is probed after 10 s and given up
#: after 3 probes 5 s apart, and data unacknowledged for 20 s closes the connection.
DEAD_PEER_OPTIONS = {
    "connect_timeout": 10,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 20_000,
}


class ScopedCursor(DriverCursor):
    """The cursor a Store keeps on a worker's own PostgreSQL connection: no session state.

    Each statement outside a transaction is sent after the prologue in one simple query, which
    PostgreSQL runs as one implicit transaction: the settings hold for the statement and end with
    it, so a server connection that a transaction pooler lends to another client next carries none
    of them (tests/test_pooler.py). A BEGIN is sent with the prologue and transaction_bound(). A
    statement the Store prepares (and the prologue) is PREPAREd once by SQL and sent as EXECUTE, so
    its plan is made (and made again after the table's statistics change) with the settings in
    force; behind a transaction pooler, where a prepared statement would stay on one server
    connection, it is sent whole instead.
    Parameters are written in as literals (bind(), else psycopg's ClientCursor), as a simple
    query needs.
    """

    __slots__ = (
        "_begin",
        "_deferred",
        "_deferred_rows",
        "_in_transaction",
        "_names",
        "_prepares",
        "_prologue",
        "_psycopg3",
        "_texts",
    )

    def __init__(self, raw: Any, errors: Any, prologue: str, prepares: bool):
        self._psycopg3 = _is_psycopg3()
        # psycopg 3: a cursor given no parameters sends a simple query, whose results start at
        # the first statement's; psycopg2 binds on the client and keeps the last statement's.
        cursor = raw.cursor()
        super().__init__(cursor, False, errors)
        self._prologue = prologue
        self._prepares = prepares
        if prepares:  # parsed and planned once per connection too
            cursor.execute(f"PREPARE rws_prologue AS {prologue}")
            self._prologue = "EXECUTE rws_prologue"
        self._begin = f"BEGIN; {self._prologue}; {transaction_bound()}"
        self._names: OrderedDict[str, str] = OrderedDict()
        self._texts: dict[tuple[str, bool, bool], tuple[str, tuple[str, ...]]] = {}
        self._in_transaction = False
        # Statements to send ahead of the next one, in its simple query, and the rows of those
        # last sent (see defer).
        self._deferred: list[tuple[str, Sequence[Any], bool]] = []
        self._deferred_rows: list[list[Any]] = []

    def execute(self, sql: str, params: Sequence[Any] = (), prepare: bool = False) -> Any:
        c = self.cursor
        if self._deferred:
            return self._execute_deferred(sql, params, prepare)
        if self._in_transaction:
            if sql in ("COMMIT", "ROLLBACK"):
                self._in_transaction = False
            return self._send(self._text(sql, prepare, False), params)
        if sql == "BEGIN":
            self._in_transaction = True
            return c.execute(self._begin)
        self._send(self._text(sql, prepare, True), params)
        if self._psycopg3:
            c.nextset()
        return c

    def defer(self, sql: str, params: Sequence[Any], prepare: bool = False) -> None:
        """Send ``sql`` ahead of the next statement, in the same simple query (psycopg 3 only):
        PostgreSQL runs a simple query's statements as one implicit transaction, so all are
        written or none, in one round trip (tests/test_deletes_with_claim.py
        test_deletes_sent_with_a_claim_roll_back_with_it). ``take_deferred_rows()`` gives the
        rows each returned, once the next statement has run."""
        self._deferred.append((sql, params, prepare))

    def take_deferred_rows(self) -> list[list[Any]]:
        """The rows of the deferred statements last sent, one list per statement; those not sent
        yet (no statement came after them) are sent now, alone."""
        if self._deferred:
            self._execute_deferred("SELECT 1", (), False)
        rows, self._deferred_rows = self._deferred_rows, []
        return rows

    def drop_deferred(self) -> None:
        """Forget deferred statements not sent yet."""
        self._deferred.clear()

    def _execute_deferred(self, sql: str, params: Sequence[Any], prepare: bool) -> Any:
        """The deferred statements, then ``sql``, as one simple query; the cursor is left on
        ``sql``'s result. Whatever happens, they are sent once at most."""
        c = self.cursor
        deferred, self._deferred = self._deferred, []
        if sql in ("BEGIN", "COMMIT", "ROLLBACK"):
            raise RuntimeError(f"a deferred statement cannot be sent with {sql}")
        parts = [] if self._in_transaction else [self._prologue]
        parts += [self._literal(self._text(d, p, False), dp) for d, dp, p in deferred]
        parts.append(self._literal(self._text(sql, prepare, False), params))
        c.execute("; ".join(parts))
        if not self._in_transaction:
            c.nextset()  # past the prologue's result
        rows = []
        for _ in deferred:
            rows.append(c.fetchall())
            c.nextset()
        self._deferred_rows = rows
        return c

    def _text(self, sql: str, prepare: bool, prologue: bool) -> tuple[str, tuple[str, ...]]:
        """What to send for ``sql``: the text (Django's placeholders) and its pieces around them."""
        key = (sql, prepare, prologue)
        text = self._texts.get(key)
        if text is None:
            body = sql
            if prepare and self._prepares:
                name = self._prepared(sql)
                count = len(_pieces(sql)) - 1
                body = f"EXECUTE {name}({', '.join(['%s'] * count)})" if count else f"EXECUTE {name}"
            full = f"{self._prologue}; {body}" if prologue else body
            text = self._texts[key] = (full, _pieces(full))
        return text

    def _send(self, text: tuple[str, tuple[str, ...]], params: Sequence[Any]) -> Any:
        """The text with ``params`` written in as literals, as one simple query."""
        if not self._psycopg3:
            return self.cursor.execute(text[0], params)
        return self.cursor.execute(self._literal(text, params))

    def _literal(self, text: tuple[str, tuple[str, ...]], params: Sequence[Any]) -> str:
        """The text with ``params`` written in as literals (psycopg 3)."""
        query = bind(text[1], params)
        if query is None:  # a value bind() leaves to psycopg, which also refuses what it must
            import psycopg

            query = psycopg.ClientCursor(self.cursor.connection).mogrify(text[0], params)
        return query

    def _prepared(self, sql: str) -> str:
        """The name ``sql`` is PREPAREd under on this connection (the last MAX_PREPARED kept)."""
        name = self._names.get(sql)
        if name is not None:
            return name
        if len(self._names) >= MAX_PREPARED:
            _, old = self._names.popitem(last=False)
            self.cursor.execute(f"DEALLOCATE {old}")
            self._texts.clear()  # some named it
        name = f"rws_{next(_NAMES)}"
        numbers = itertools.count(1)
        text = PLACEHOLDER.sub(lambda _: f"${next(numbers)}", sql).replace("%%", "%")
        self.cursor.execute(f"PREPARE {name} AS {text}")
        self._names[sql] = name
        return name


def bind(pieces: tuple[str, ...], params: Sequence[Any]) -> str | None:
    """The statement whose ``pieces`` lie around its placeholders (_pieces) with ``params``
    written in as SQL literals, or None when a value is not one of the few kinds the worker's
    statements bind: int (not bool), str without NUL, None, and lists of those. Strings are E''
    literals (backslash and quote doubled), which mean the same whatever
    standard_conforming_strings says (tests/test_pooler.py pins this)."""
    if len(pieces) != len(params) + 1:
        return None
    out = [pieces[0]]
    for value, piece in zip(params, pieces[1:], strict=True):
        literal = _literal(value)
        if literal is None:
            return None
        out.append(literal)
        out.append(piece)
    return "".join(out)


@functools.lru_cache(maxsize=512)
def _pieces(sql: str) -> tuple[str, ...]:
    """``sql`` split at Django's placeholders, each piece's ``%%`` made ``%``."""
    return tuple(piece.replace("%%", "%") for piece in PLACEHOLDER.split(sql))


def _literal(value: Any) -> str | None:
    kind = type(value)
    if kind is int:
        return str(value)
    if kind is str:
        if "\x00" in value:
            return None
        return "E'" + value.replace("\\", "\\\\").replace("'", "''") + "'"
    if value is None:
        return "NULL"
    if kind is list or kind is tuple:
        items = [_literal(v) for v in value]
        if not items or None in items or "NULL" in items:
            return None
        return f"ARRAY[{', '.join(items)}]"  # type: ignore[arg-type]
    return None


#: A claim from the band's start slower than this (seconds) read dead entries it could not skip:
#: the claims of the next RESUMING_FOR seconds resume after their last row (PostgreSQLBackend.claim).
SLOW_CLAIM = 0.002
RESUMING_FOR = 30.0
#: Seconds of due times a resumed claim that comes back short looks back before its point: the
#: jobs of transactions that committed after a claim passed their place, and retries that came
#: due in the second of the point (PostgreSQLBackend.resumed_select).
LOOK_BACK = 2
#: While resuming, a claim starts at the band's start again after MIN_RESUME_SECONDS, or after
#: START_COST_FACTOR times the last such claim's duration, so that they take about 1% of a
#: worker's time and fewer than 1% of its claims, but at most after MAX_RESUME_SECONDS: the
#: longest a job that sorts before the point by more than LOOK_BACK waits (tests/test_tick.py
#: test_a_job_far_behind_a_resumed_point_waits_until_the_next_claim_from_the_start).
MIN_RESUME_SECONDS = 5.0
START_COST_FACTOR = 100
MAX_RESUME_SECONDS = 30.0

#: How many statements a ScopedCursor keeps PREPAREd (psycopg's own default).
MAX_PREPARED = 100
_NAMES = itertools.count(1)


class PostgreSQLFeatures(BaseFeatures):
    wakeup = "listen"
    resumes_claims = True
    resumes_with_queue_filter = True

    @cached_property
    def deletes_with_claim(self) -> bool:  # type: ignore[override]
        # One round trip and one commit per claim, where two were (docs/design.md, "Completing jobs").
        return _is_psycopg3()

    @cached_property
    def deletes_in_claim_query(self) -> bool:  # type: ignore[override]
        return _is_psycopg3()

    max_query_params = 65_535  # the protocol's limit
    shared_lock = " FOR SHARE"
    row_lock = " FOR UPDATE"
    # clock_timestamp(), not now(): inside a transaction now() is the transaction's start.
    server_clock_sql = "SELECT EXTRACT(EPOCH FROM clock_timestamp())"

    @cached_property
    def bulk_insert(self) -> str:  # type: ignore[override]
        return "copy" if _is_psycopg3() else "multirow"  # psycopg 3's cursor.copy()


class PostgreSQLBackend(BaseBackend):
    features_class = PostgreSQLFeatures
    claim_lock = " FOR UPDATE SKIP LOCKED"
    claim_key = "ctid"

    def __init__(self, conn: Any):
        super().__init__(conn)
        self._resumed: dict[tuple[Any, ...], tuple[str, list[Any]]] = {}  # see resumed_select

    def claim_update(self, select: Sql, token: str, lease_until: int, now: int, locks: bool = False) -> Sql:
        """The claim's UPDATE finds the rows by the row versions the select locked (claim_key),
        which PostgreSQL reads directly (a TID scan): no plan can read an index's whole range
        for them, as one did for the ids, by a column of the queue index, while the statistics
        counted a few live rows and the index held a held snapshot's dead entries. ARRAY() runs
        the select once: as the subquery of an IN, a plan could run it again for each row (a
        nested loop semi join), and each run would pass over the rows the UPDATE had taken and
        lock the next ones: more jobs than LIMIT (tests/test_tick.py
        test_a_claim_takes_no_more_jobs_than_asked_whatever_the_plan). It marks only row
        versions the select locked, so no job is claimed twice."""
        sql = Sql(f"UPDATE rws_jobs SET {CLAIM_SET} WHERE ctid = ANY(ARRAY(", [token, lease_until, now])
        return sql.join(select).add(f"{'' if locks else self.claim_lock})) RETURNING {CLAIM_COLUMNS}")

    def complete_delete(self, ids: Sequence[str], token: str) -> Sql:
        """Delete finished jobs that the claim ``token`` still holds: the rows a select finds by
        primary key, read by their ctid. The select asks for the ids' order, which only the
        primary key gives without a sort (the worker turns sorts off; a single id is listed twice,
        for the order of one constant is any index's): by "id IN (...)" alone,
        after an analyze that found the queue nearly empty, a plan scanned the queue index, whose
        last column is the id, through every dead entry a held snapshot keeps
        (tests/test_explain.py
        test_completions_go_by_primary_key_after_an_analyze_of_a_nearly_empty_queue)."""
        listed = list(ids) if len(ids) > 1 else [*ids, *ids]
        return Sql(
            "DELETE FROM rws_jobs WHERE ctid = ANY(ARRAY(SELECT ctid FROM rws_jobs WHERE id IN "
            f"({placeholders(len(listed))}) ORDER BY id)) AND locked_by = %s "
            "AND (status = 'running') IS TRUE",
            [*listed, token],
        )

    def claim_queue_filter(self, queues: Sequence[str] | None) -> Sql:
        """One queue is written into the claim, which is prepared: a generic plan for any queue
        weighs the queue by the table's average and keeps to the claim index, reading other
        queues' rows. An E'' literal escapes the same whatever standard_conforming_strings says;
        "%" is doubled for the driver's placeholder syntax (tests/test_exact_match.py)."""
        if queues and len(queues) == 1:
            text = queues[0].replace("\\", "\\\\").replace("'", "''").replace("%", "%%")
            return Sql(f" AND queue = E'{text}'")
        return queue_filter(queues)

    def deadlocked(self, exc: BaseException) -> bool:
        # deadlock_detected (SQLSTATE 40P01).
        return getattr(exc.__cause__, "sqlstate", None) == "40P01"

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
        """While an old snapshot keeps the claimed rows' dead versions, a claim from the band's
        start visits every one of them, and so do the idle worker's probe and the band walk. Once a
        claim took longer than SLOW_CLAIM, the claims of the next RESUMING_FOR seconds start at the
        Store's resume point instead: one statement takes the due jobs after it, and, if they are
        too few, those of the LOOK_BACK seconds before it (resumed_select). A claim that comes back
        short then looks only at the bands below the point's, unless a band above it holds a pending
        job: then it claims from the top. Jobs further behind the point are taken by the next claim
        from the band's start, when the point expires (keep_point; tests/test_tick.py, the tests of
        the resumed claim). Without dead entries to skip, a claim from the start costs no more, and
        resuming would only cost the worker's CPU
        (test_a_postgresql_claim_resumes_after_a_slow_one_only)."""
        started = time.monotonic()
        point = self.resume_point(store, queues)
        if point is None or limit < 1 or started >= store.resuming_until:
            # (a dispatcher with no free thread asks for none)
            rows = super().claim(store, token, now, lease_until, queues, limit, probe_first)
            ended = time.monotonic()
            if limit >= 1:
                took = ended - started
                # The point is kept for the shorter of the last two such claims: one slow claim
                # alone may be a new connection's first, or a wait for the CPU.
                steady = min(took, store.start_claim_took)
                store.start_claim_took = took
                if took > SLOW_CLAIM:
                    store.resuming_until = ended + RESUMING_FOR
                if ended < store.resuming_until:
                    self.keep_point(store, rows, steady)
            return rows
        with store.writes, store.cursor() as c:
            select = self.resumed_select(queues, point, now, limit)
            rows = self.mark(store, c, select, token, lease_until, now, locks=True)
            if not rows and self.higher_band(store, c, queues, point[0]):
                store.resume = None
                rows = self.claim_bands(
                    store, c, token, lease_until, now, queues, limit, [], None, store.walk_first
                )
            elif len(rows) < limit:
                rows = self.claim_bands(
                    store, c, token, lease_until, now, queues, limit, rows, point[0], True
                )
            self.move_point(store, rows)
            return rows

    def keep_point(self, store: Store, rows: list[Claimed], took: float) -> None:
        """After a claim from the top while resuming: the point moves past its rows (or stays
        where it was when it took none: nothing is due before it), and is kept MIN_RESUME_SECONDS,
        or START_COST_FACTOR times ``took`` (the shorter of the last two such claims), up to
        MAX_RESUME_SECONDS (tests/test_tick.py
        test_a_postgresql_claim_resumes_after_a_slow_one_only)."""
        self.move_point(store, rows)
        if store.resume is not None:
            keep = min(max(MIN_RESUME_SECONDS, START_COST_FACTOR * took), MAX_RESUME_SECONDS)
            store.resume_until = time.monotonic() + keep

    @staticmethod
    def move_point(store: Store, rows: list[Claimed]) -> None:
        """The point moves to the last row a claim took (in claim order: the lowest band's
        last), never back within its band (the rows before it a resumed claim takes)."""
        if rows:
            last = rows[-1]
            key = (last.priority, *band_order_key(last))
            point = store.resume
            if point is None or key[0] != point[0] or key[1:] > point[1:]:
                store.resume = key

    def resumed_select(
        self, queues: Sequence[str] | None, point: tuple[Any, ...], now: int, want: int
    ) -> Sql:
        """Up to ``want`` due jobs of the point's band, locked, while no band above it holds a
        pending job: those after the point in claim order, then, if they are too few, those of
        the LOOK_BACK seconds of due times before it. Each is one range of the claim index (or
        the queue index) that starts at its bound and stops at LIMIT, and the second one runs
        only when the first comes back short (tests/test_explain.py
        test_a_resumed_claim_starts_at_its_point_past_dead_entries). The band is a parameter,
        not a subquery, and the point leaves out the priority: so PostgreSQL starts the range
        at the point, where a row comparison over the priority too starts it at the band's
        start and walks the dead entries, checking each."""
        key = (tuple(queues) if queues else None, want)
        kept = self._resumed.get(key)
        if kept is None:
            if len(self._resumed) >= 64:
                self._resumed.clear()
            qsql = self.claim_queue_filter(queues)
            hint = self.claim_index_hint(queues)
            rows = f"SELECT ctid FROM rws_jobs{hint} WHERE status = 'pending' AND priority = %s"
            higher = self.higher_band_select(queues, 0).text
            end = (
                f"{qsql.text} AND ({higher}) IS NULL ORDER BY {BAND_ORDER_ASC} LIMIT {want}{self.claim_lock}"
            )
            after = f"{rows} AND next_run_at <= %s AND (next_run_at, created_at, id) > (%s, %s, %s){end}"
            before = (
                f"{rows} AND next_run_at >= %s AND next_run_at <= %s"
                f" AND (next_run_at, created_at, id) < (%s, %s, %s){end}"
            )
            # (FOR UPDATE is refused in a branch of UNION, not in a subquery of one.)
            text = (
                f"SELECT ctid FROM ({after}) AS after_point"
                f" UNION ALL SELECT ctid FROM ({before}) AS before_point LIMIT {want}"
            )
            kept = self._resumed[key] = (text, qsql.params)
        text, queue_params = kept
        priority, next_run_at, created_at, job_id = point
        guard = [*queue_params, priority, *queue_params]
        after_params = [priority, now, next_run_at, created_at, job_id, *guard]
        before_params = [priority, next_run_at - LOOK_BACK, now, next_run_at, created_at, job_id, *guard]
        return Sql(text, [*after_params, *before_params])

    def higher_band_select(self, queues: Sequence[str] | None, band: int) -> Sql:
        """The priority of a pending job of a band above ``band``, if any (resumed_select's guard):
        the last entry of the pending range, read backwards, the newest (ORDER BY: a generic plan
        otherwise reads another index's whole range)."""
        qsql = self.claim_queue_filter(queues)
        return Sql(
            f"SELECT priority FROM rws_jobs WHERE status = 'pending' AND priority > %s{qsql.text} "
            "ORDER BY priority DESC LIMIT 1",
            [band, *qsql.params],
        )

    def higher_band(self, store: Store, c: Any, queues: Sequence[str] | None, band: int) -> bool:
        """Whether a band above ``band`` holds a pending job."""
        store.execute(c, *self.higher_band_select(queues, band))
        return c.fetchone() is not None

    def top_due_band_select(self, queues: Sequence[str] | None, below: int | None, now: int) -> Sql:
        # Left to itself PostgreSQL reads the claim index backwards for MAX, through every future
        # row of the bands above; OFFSET 0 keeps the due rows a query of their own.
        due = self.due_rows("priority", queues, below, now)
        return Sql("SELECT MAX(priority) FROM (").join(due).add(" OFFSET 0) AS due")

    def horizon(self) -> horizon.Horizon:
        """The oldest session of this database with a snapshot or a transaction id, the slots
        holding an xmin, and the queue table's dead rows (tests/test_horizon.py)."""
        with self.conn.cursor() as c:
            return horizon.postgresql(c)

    def driver_cursor(self) -> DriverCursor:
        raw = self.conn.cursor().cursor.connection  # connects as Django does
        return ScopedCursor(raw, self.conn.wrap_database_errors, prologue(), self.prepares_statements())

    @contextmanager
    def time_limit(self, seconds: float) -> Iterator[None]:
        # statement_timeout for this transaction only (set_config(..., true)): behind a
        # transaction pooler a session value would stay on a server connection that another
        # client gets next (tests/test_pooler.py).
        # Inside a caller's transaction (ATOMIC_REQUESTS) the old value is put back on the way
        # out; a statement that failed takes the value with it when its savepoint rolls back.
        with transaction.atomic(using=self.conn.alias):
            with self.conn.cursor() as c:
                c.execute(
                    "SELECT current_setting('statement_timeout'), set_config('statement_timeout', %s, true)",
                    [f"{max(1, round(seconds * 1000))}ms"],
                )
                (before, _) = c.fetchone()
            yield
            with self.conn.cursor() as c:
                c.execute("SELECT set_config('statement_timeout', %s, true)", [before])

    def is_time_limit_error(self, exc: BaseException) -> bool:
        cause = exc.__cause__
        return (getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)) == QUERY_CANCELED

    def private_options(self, options: dict[str, Any]) -> dict[str, Any]:
        # A peer that vanished (a dropped NAT entry, a firewall that drops packets) is noticed by
        # TCP within seconds instead of Linux's two hours; a project's own values are kept.
        for key, value in DEAD_PEER_OPTIONS.items():
            options.setdefault(key, value)
        # psycopg 3 prepares nothing by itself here: the hot statements are PREPAREd by SQL, where
        # that is allowed (ScopedCursor, prepares_statements).
        if _is_psycopg3():
            options["prepare_threshold"] = None
        return options

    def prepares_statements(self) -> bool:
        # The same few statements run for every job: prepared, PostgreSQL stops planning each one
        # anew. Not behind a transaction pooler (the name would stay on one server connection and
        # be missing, or taken, on the next: tests/test_pooler.py), nor where the project turned
        # off server-side binding, as the docs asked before RWS_JOBS["POOLER"].
        conn = self.conn
        return (
            getattr(conn, "rws_private", False)
            and _is_psycopg3()
            and not behind_transaction_pooler(conn.settings_dict)
            and conn.settings_dict.get("OPTIONS", {}).get("server_side_binding") is not False
        )

    def insert_members(self, c: Any, batch_id: str, job_ids: Sequence[str], watched: bool) -> None:
        if self.features.bulk_insert != "copy" or watched:
            return super().insert_members(c, batch_id, job_ids, watched)
        with self.conn.wrap_database_errors, c.cursor.copy(MEMBERS_COPY_SQL) as copy:
            for job_id in job_ids:
                copy.write_row((job_id, batch_id))

    def insert_many(
        self, c: Any, rows: Iterator[list[Any]], batch_size: int, where: Callable[[], str], watched: bool
    ) -> None:
        if self.features.bulk_insert != "copy" or watched:
            return super().insert_many(c, rows, batch_size, where, watched)
        # COPY streams the rows: several times faster than multi-row INSERTs (docs/benchmarks.md).
        with self.conn.wrap_database_errors, c.cursor.copy(COPY_SQL) as copy:
            for row in rows:
                copy.write_row(row)
