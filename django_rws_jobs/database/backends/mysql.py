"""MariaDB/MySQL: claims that lock, then mark, resumed where the last one stopped; index hints."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import cached_property
from typing import Any

from django.db.models import BooleanField
from django.db.models.expressions import RawSQL

from . import horizon
from .base import BaseBackend, BaseFeatures, Store, idle_transaction_seconds, is_registered
from .claimed import CLAIM_COLUMNS, Claimed, claim_order_key
from .cursors import DriverCursor
from .inserts import INSERT_HEAD, INSERT_VALUES
from .mysql_inserts import check_insert_size, insert_quoted, insert_sized, max_statement_bytes, pipelines
from .statements import (
    CLAIM_INDEX,
    CLAIM_SET,
    DUE_INDEX,
    QUEUE_INDEX,
    REPLACED,
    WAITS,
    Sql,
    below_filter,
    one_queue,
    placeholders,
    queue_filter,
)

#: The protocol's CLIENT_MULTI_STATEMENTS capability flag.
CLIENT_MULTI_STATEMENTS = 1 << 16
LOCKING = " FOR UPDATE SKIP LOCKED"
#: A statement stopped by MariaDB's max_statement_time, by MySQL's max_execution_time.
TIME_LIMIT_ERRNOS = (1969, 3024)


#: The driver's timeouts on the worker's own connections, in seconds (docs/design.md, "Dead
#: connections"). libmysqlclient retries a timed-out read twice, so a silent peer fails a read
#: after up to three times read_timeout.
DEAD_PEER_OPTIONS = {"connect_timeout": 10, "read_timeout": 10, "write_timeout": 10}


class MySQLFeatures(BaseFeatures):
    resumes_claims = True
    shared_lock = " LOCK IN SHARE MODE"
    row_lock = " FOR UPDATE"
    # SYSDATE(6), not NOW(6): the time it runs, not the statement's start; UNIX_TIMESTAMP of it
    # does not depend on the session's time_zone.
    server_clock_sql = "SELECT UNIX_TIMESTAMP(SYSDATE(6))"

    @property
    def sends_several_statements(self) -> bool:  # type: ignore[override]
        return sends_several(self.conn)

    @cached_property
    def can_return_deleted(self) -> bool:  # type: ignore[override]
        return bool(self.conn.mysql_is_mariadb)  # MariaDB has DELETE ... RETURNING, MySQL not

    @cached_property
    def deletes_with_claim(self) -> bool:  # type: ignore[override]
        # MariaDB: after the claim's BEGIN, in its first call (DeferringCursor), one round trip
        # and one commit fewer per claim; elsewhere in a statement of their own before the claim.
        return self.can_return_deleted

    @cached_property
    def deletes_in_claim_query(self) -> bool:  # type: ignore[override]
        return self.can_return_deleted

    @cached_property
    def bulk_insert(self) -> str:  # type: ignore[override]
        self.conn.ensure_connection()
        return "pipelined" if pipelines(self.conn.connection) else "multirow"


def sends_several(conn: Any) -> bool:
    """Whether ``conn``'s driver connection accepts several statements in one call.

    Asked of the client flags the connection was opened with (mysqlclient sets the flag by
    default, PyMySQL does not), not of the driver's name. The claim sends single statements
    where it is off (tests/test_tick.py test_under_pymysql_the_worker_claims_with_one_statement_per_call;
    the dj61:pymysql cell of scripts/test runs the MariaDB tests through PyMySQL).
    """
    return bool(getattr(conn.connection, "client_flag", 0) & CLIENT_MULTI_STATEMENTS)


#: Member rows in one INSERT at most (insert_members).
MEMBERS_PER_STATEMENT = 5000


class DeferringCursor(DriverCursor):
    """The cursor a Store keeps on a worker's own MariaDB connection where the driver sends
    several statements per call: deletions of succeeded jobs wait (``defer``) for the next claim,
    which sends them after its BEGIN in its first call, so they commit or roll back with it
    (_Claim._first; tests/test_deletes_with_claim.py). ``take_deferred_rows()`` gives what each
    deletion returned; one no claim carried (nothing was due) is sent then, alone."""

    __slots__ = ("deferred", "deferred_rows")

    def __init__(self, cursor: Any, errors: Any):
        super().__init__(cursor, False, errors)
        self.deferred: list[tuple[str, list[Any]]] = []
        self.deferred_rows: list[list[Any]] = []

    def defer(self, sql: str, params: Sequence[Any], prepare: bool = False) -> None:
        self.deferred.append((sql, [*params]))

    def take_deferred_rows(self) -> list[list[Any]]:
        pending, self.deferred = self.deferred, []
        for sql, params in pending:
            self.cursor.execute(sql, params)
            self.deferred_rows.append(list(self.cursor.fetchall()))
        rows, self.deferred_rows = self.deferred_rows, []
        return rows

    def drop_deferred(self) -> None:
        self.deferred.clear()


class MySQLBackend(BaseBackend):
    features_class = MySQLFeatures

    def horizon(self) -> horizon.Horizon:
        """The oldest InnoDB transaction and the history list length (tests/test_horizon.py)."""
        with self.conn.cursor() as c:
            return horizon.mysql(c)

    def upsert_adding(
        self,
        table: str,
        keys: Sequence[str],
        adds: Sequence[str],
        maxes: Sequence[str],
        rows: Sequence[Sequence[Any]],
    ) -> Sql:
        sets = [f"{c} = {c} + VALUES({c})" for c in adds] + [
            f"{c} = GREATEST({c}, VALUES({c}))" for c in maxes
        ]
        return self._insert_rows(table, [*keys, *adds, *maxes], rows).add(
            f" ON DUPLICATE KEY UPDATE {', '.join(sets)}"
        )

    def primary_key_hint(self) -> str:
        return " FORCE INDEX (PRIMARY)"

    def upsert_replacing(
        self, table: str, keys: Sequence[str], values: Sequence[str], rows: Sequence[Sequence[Any]]
    ) -> Sql:
        sets = [f"{c} = VALUES({c})" for c in values]
        return self._insert_rows(table, [*keys, *values], rows).add(
            f" ON DUPLICATE KEY UPDATE {', '.join(sets)}"
        )

    @property
    def replace_returns(self) -> bool:  # type: ignore[override]
        # MariaDB's INSERT ... ON DUPLICATE KEY UPDATE ... RETURNING returns the row inserted, or
        # the row that held the key as the statement left it (changed or not); MySQL has none.
        return bool(self.features.can_return_deleted)

    @cached_property
    def replace_job_sql(self) -> str:
        # Each assignment sees the ones before it: next_run_at reads the old due_by. Without
        # RETURNING (MySQL) the caller reads the row back under its lock.
        waits = f"status IN {WAITS}"
        sets = ", ".join(f"{c} = IF({waits}, VALUES({c}), {c})" for c in REPLACED)
        return (
            f"{INSERT_HEAD.replace(') VALUES ', ', due_by) VALUES ')}{INSERT_VALUES[:-1]}, %s) "
            f"ON DUPLICATE KEY UPDATE {sets}, "
            f"next_run_at = IF({waits}, LEAST(VALUES(next_run_at), "
            "COALESCE(due_by, created_at + %s, VALUES(next_run_at))), next_run_at), "
            f"due_by = IF({waits}, COALESCE(due_by, created_at + %s), due_by)"
            + (" RETURNING id, status" if self.replace_returns else "")
        )

    def deadlocked(self, exc: BaseException) -> bool:
        # ER_LOCK_DEADLOCK: InnoDB rolled back the whole transaction.
        code = getattr(exc.__cause__, "args", (None,))[0]
        return bool(code == 1213)

    def take_window(self, digest: str, job_id: str, now: int, until: int) -> Sql:
        # The assignments run left to right, each seeing the ones before: job_id's reads the old until.
        return Sql(
            "INSERT INTO rws_unique_windows (unique_hash, job_id, until) VALUES (%s, %s, %s) "
            "ON DUPLICATE KEY UPDATE job_id = IF(until <= %s, VALUES(job_id), job_id), "
            "until = IF(until <= %s, VALUES(until), until)",
            [digest, job_id, until, now, now],
        )

    def claim_index_hint(self, queues: Sequence[str] | None) -> str:
        # MariaDB would weigh every index the conditions name each time it plans a claim, a large
        # part of the claim's time: it is told the index.
        return f" FORCE INDEX ({QUEUE_INDEX if one_queue(queues) else CLAIM_INDEX})"

    def due_index_hint(self) -> str:
        return f" FORCE INDEX ({DUE_INDEX})"  # (see SQLiteBackend.due_index_hint)

    def queue_index_hint(self) -> str:
        return f" FORCE INDEX ({QUEUE_INDEX})"

    def concat(self, *parts: str) -> str:
        return f"CONCAT({', '.join(parts)})"

    def due_band_select(self, queues: Sequence[str] | None, below: int | None, now: int) -> Sql:
        """Statements.due_band_select for MariaDB/MySQL, whose correlated MIN and MAX subqueries
        read the whole band. A loose index scan instead: one index dive per band for its earliest
        due time (tests/test_explain.py assert_band_walk). The status (and a single queue) is
        written as a range: with an equality MariaDB reads the index by ``ref``, every row."""
        if not queues:
            index, group, qsql = CLAIM_INDEX, "status, priority", Sql()
        elif one_queue(queues):
            index, group = QUEUE_INDEX, "status, queue, priority"
            qsql = Sql(" AND queue >= %s AND queue <= %s", [queues[0], queues[0]])
        else:
            index, group, qsql = QUEUE_INDEX, "status, queue, priority", queue_filter(queues)
        due = "CASE WHEN first <= %s THEN priority END"
        sql = Sql(
            f"SELECT MAX({due}), 1, MAX({due}) < MAX(priority) FROM (SELECT priority, MIN(next_run_at) "
            f"AS first FROM rws_jobs FORCE INDEX ({index}) "
            "WHERE status >= 'pending' AND status <= 'pending'",
            [now, now],
        )
        return sql.join(qsql).join(below_filter(below)).add(f" GROUP BY {group}) AS bands")

    @contextmanager
    def time_limit(self, seconds: float) -> Iterator[None]:
        # MariaDB's max_statement_time is in seconds, MySQL's max_execution_time in ms.
        name, value = (
            ("max_statement_time", seconds)
            if self.conn.mysql_is_mariadb
            else ("max_execution_time", max(1, round(seconds * 1000)))
        )
        with self.conn.cursor() as c:
            c.execute(f"SET @rws_time_limit = @@SESSION.{name}, SESSION {name} = %s", [value])
        try:
            yield
        finally:
            with self.conn.cursor() as c:
                c.execute(f"SET SESSION {name} = @rws_time_limit")

    def is_time_limit_error(self, exc: BaseException) -> bool:
        args: tuple[Any, ...] = getattr(exc.__cause__, "args", ())
        return bool(args) and args[0] in TIME_LIMIT_ERRNOS

    def configure_session(self) -> None:
        # A worker's transaction left idle by a client that is gone (no RST ever comes through a
        # partition) would keep its row locks until wait_timeout, hours: every claim skips those
        # rows. MariaDB ends the session after idle_transaction_timeout instead. A session
        # variable, set once per connection: a MariaDB pooler (MaxScale, ProxySQL) keeps a
        # connection's session variables with it. MySQL has no such variable
        # (docs/howto/databases.md says what to do there).
        conn = self.conn
        if getattr(conn, "rws_private", False) and conn.mysql_is_mariadb:
            with conn.cursor() as c:
                c.execute("SET SESSION idle_transaction_timeout = %s", [idle_transaction_seconds()])

    def private_options(self, options: dict[str, Any]) -> dict[str, Any]:
        # Under REPEATABLE READ, InnoDB keeps locks on rows a claim read but did not take (other
        # queues' jobs), and other workers' SKIP LOCKED would pass them over.
        options.setdefault("isolation_level", "read committed")
        # A peer that vanished or never answers is noticed within these (mysqlclient and PyMySQL
        # both take them); a project's own values are kept.
        for key, value in DEAD_PEER_OPTIONS.items():
            options.setdefault(key, value)
        # The claim sends BEGIN with its first statement and COMMIT with its last where the driver
        # allows several statements per call: mysqlclient does unless told not to (PyMySQL does
        # not; see sends_several). Only the Store's statements run on this connection, their
        # parameters escaped by the driver.
        options.pop("multi_statements", None)
        return options

    def driver_cursor(self) -> DriverCursor:
        cursor = super().driver_cursor()
        if self.features.can_return_deleted and self.features.sends_several_statements:
            return DeferringCursor(cursor.cursor, cursor._errors)
        return cursor

    def exact_id(self, rows: Any, job_id: str) -> Any:
        """PAD SPACE collations, utf8mb4_bin among them, also match 'a ' to 'a' (and a _ci one
        'A'): the bytes must match too (tests/test_input.py
        test_retry_and_delete_give_the_same_answer_on_every_database)."""
        return rows.filter(RawSQL("BINARY id = %s", [job_id], output_field=BooleanField()))

    def insert_many(
        self, c: Any, rows: Iterator[list[Any]], batch_size: int, where: Callable[[], str], watched: bool
    ) -> None:
        if self.features.bulk_insert == "pipelined" and not watched:
            insert_quoted(self.conn, c.cursor.connection, rows, batch_size, where)
        else:
            insert_sized(self.conn, c, rows, batch_size, where)

    def check_insert_size(self, params: list[Any], what: str) -> None:
        check_insert_size(self.conn, params, what)

    def members_per_insert(self) -> int:
        # As many rows a statement as the server's packet takes, up to MEMBERS_PER_STATEMENT
        # (ids are at most 64 characters).
        per_row = 2 * (64 + 3) + 4
        return max(1, min(MEMBERS_PER_STATEMENT, (max_statement_bytes(self.conn) - 100) // per_row))

    # -- the claim --------------------------------------------------------------------------------

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
        """No UPDATE ... RETURNING here: lock the band's first free rows, mark them, commit.

        The band is read in index order with no sort, so InnoDB locks only the rows LIMIT returns
        (a sorted FOR UPDATE would lock every row it read first) and SKIP LOCKED passes over rows
        another worker holds.

        A claim from the top starts after the row the Store's last claim took (its resume point,
        BaseBackend.resume_point): InnoDB keeps the claimed rows' index entries, delete-marked,
        until its purge gets to them, and a locking read from the band's start visits each. A
        resumed claim that comes back short looks from the band's start too, in the same
        transaction. Not with a queue filter: then MariaDB cannot know the top band when it
        plans the claim (the subquery must read rows), and the point would not bound the range.
        """
        from_top = below is None and band is None  # the claim's first look
        resume = self.resume_point(store, queues) if from_top else None
        select = self.claim_select(CLAIM_COLUMNS, queues, below, band, now, want)
        claim = _Claim(store, token, [token, lease_until, now], want)
        if resume is not None:
            claim.resumed = self.claim_select(CLAIM_COLUMNS, queues, below, band, now, want, after=resume)
        rows = self._in_transaction(store, claim, select)
        if rows:
            self.keep_resume_point(store, queues, rows[-1])
        return rows

    def _in_transaction(self, store: Store, claim: _Claim, select: Sql) -> list[Claimed]:
        if is_registered(self.conn):  # tick(): the caller's connection, perhaps inside its transaction
            with self.atomic(), self.conn.cursor() as c:
                return claim.lock_and_mark(c, False, select)
        kept: Any = store.cursor()  # (connects first: sends_several asks the driver's connection)
        if not self.features.sends_several_statements:  # PyMySQL: one statement per call
            with store.atomic():
                return claim.lock_and_mark(kept, False, select)
        # The worker's own connection: BEGIN goes with the first statement and COMMIT with the
        # last, so a claim is two round trips instead of four.
        with kept:
            try:
                claim.deferring = kept if isinstance(kept, DeferringCursor) else None
                return claim.lock_and_mark(kept.cursor, True, select)
            except BaseException:
                _roll_back(kept.cursor)
                raise

    def delete_finished(
        self, store: Store, c: Any, token: str, ids: list[str], metadata: bool = False
    ) -> list[tuple[Any, ...]]:
        if self.features.can_return_deleted:
            return super().delete_finished(store, c, token, ids, metadata)
        # MySQL has no DELETE ... RETURNING: lock what is still ours, then delete it.
        held = (
            f"SELECT id, batch_id, has_dependents{', metadata' if metadata else ''} FROM rws_jobs "
            f"WHERE status = 'running' AND locked_by = %s AND id IN ({placeholders(len(ids))}) FOR UPDATE"
        )
        with store.atomic():
            c.execute(held, [token, *ids])
            mine = list(c.fetchall())
            if mine:
                c.execute(
                    f"DELETE FROM rws_jobs WHERE id IN ({placeholders(len(mine))})", [r[0] for r in mine]
                )
        return mine


class _Claim:
    """One claim's transaction: lock the band's rows, mark them as ``token``'s."""

    def __init__(self, store: Store, token: str, set_params: list[Any], want: int):
        self.store, self.token, self.set_params, self.want = store, token, set_params, want
        self.resumed: Sql | None = None  # the select from the resume point, if any
        self.deferring: DeferringCursor | None = None  # deletions to send with the first call

    def lock_and_mark(self, c: Any, own: bool, select: Sql) -> list[Claimed]:
        """With ``own``, the transaction begins with the first statement and commits with the
        last (``c`` is then the driver's cursor)."""
        if self.resumed is None:
            rows = self._first(c, own, select)
        else:
            rows = self._first(c, own, self.resumed)
            if len(rows) < self.want:  # rows before the point too; locks held twice are ours
                self.store.resume = None
                c.execute(select.text + LOCKING, select.params)
                seen = {job.id for job in rows}
                rows += [job for job in self._rows(c) if job.id not in seen]
                rows.sort(key=claim_order_key)
                rows = rows[: self.want]
        if rows:
            c.execute(
                f"UPDATE rws_jobs SET {CLAIM_SET} WHERE id IN ({placeholders(len(rows))})"
                + ("; COMMIT" if own else ""),
                [*self.set_params, *(job.id for job in rows)],
            )
            if own:
                while c.nextset():
                    pass
        elif own:
            c.execute("COMMIT")
        return rows

    def _first(self, c: Any, own: bool, select: Sql) -> list[Claimed]:
        deferred = self.deferring.deferred if own and self.deferring is not None else []
        if deferred:
            assert self.deferring is not None
            self.deferring.deferred = []
            texts = "; ".join(sql for sql, _ in deferred)
            params = [p for _, ps in deferred for p in ps]
            c.execute(f"BEGIN; {texts}; {select.text}{LOCKING}", [*params, *select.params])
            c.nextset()  # past BEGIN
            for _ in deferred:
                self.deferring.deferred_rows.append(list(c.fetchall()))
                c.nextset()
            return self._rows(c)
        c.execute(("BEGIN; " if own else "") + select.text + LOCKING, select.params)
        if own:
            c.nextset()
        return self._rows(c)

    def _rows(self, c: Any) -> list[Claimed]:
        return [Claimed.from_row(row, self.token) for row in c.fetchall()]


def _roll_back(raw_cursor: Any) -> None:
    """End a failed transaction: read what the server still sends for the statements of the call
    that failed, then roll back (if the connection still works; if not, the caller's error says
    so and the connection is dropped)."""
    try:
        while raw_cursor.nextset():
            pass
    except Exception:
        pass
    try:
        raw_cursor.execute("ROLLBACK")
    except Exception:
        pass
