"""The queue's statements, built from parts: each builder appends text and its parameters together,
so no statement is made by editing another's text and no parameter list is counted by hand.

Every database's backend (backends/base.py) inherits these builders and overrides the hooks where
its SQL differs: index hints, the queue filter, the band walk, the lock of the claim.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import cached_property
from operator import attrgetter
from typing import Any

from ...models import CLAIM_ORDER_COLUMNS, Job
from .claimed import CLAIM_COLUMNS
from .inserts import INSERT_HEAD, INSERT_VALUES


class Sql:
    """A statement's text and its parameters (Django's ``%s`` placeholders), built together."""

    __slots__ = ("params", "text")

    def __init__(self, text: str = "", params: Sequence[Any] = ()):
        self.text = text
        self.params = [*params]

    def add(self, text: str, *params: Any) -> Sql:
        self.text += text
        if params:
            self.params += params
        return self

    def join(self, part: Sql) -> Sql:
        """Append ``part``'s text and parameters (``part`` is left as it is)."""
        if part.text:
            self.text += part.text
            self.params += part.params
        return self

    def __iter__(self) -> Iterator[Any]:  # sql, params = statement; cursor.execute(*statement)
        return iter((self.text, self.params))


CLAIM_SET = "status = 'running', locked_by = %s, locked_until = %s, started_at = %s"
#: What a deletion of finished jobs returns: each deleted job's id, batch_id and has_dependents.
DELETED_RETURNING = " RETURNING id, batch_id, has_dependents"
#: What a replace changes of the waiting job holding a key, besides its due time
#: (api/enqueue_once.py), and the statuses of a job that waits.
REPLACED = ("payload", "max_retries", "queue", "priority", "timeout", "metadata")
WAITS = "('pending', 'waiting', 'blocked')"
#: Bands without due jobs a claim's band walk passes before it looks for the highest due band by
#: reading the due rows (see due_band_select).
MAX_BAND_WALK = 64
#: The claim order within one priority band (CLAIM_ORDER after its first column), as SQL. Within a
#: band every column ascends: BAND_ORDER, band_order_key and after_point are written for that.
BAND_ORDER = ", ".join(CLAIM_ORDER_COLUMNS[1:])
BAND_ORDER_ASC = ", ".join(f"{name} ASC" for name in CLAIM_ORDER_COLUMNS[1:])
#: Sort keys of Claimed rows: within one band, and in the whole claim order.
band_order_key = attrgetter(*CLAIM_ORDER_COLUMNS[1:])


def _index(*fields: str) -> str:
    return next(index.name for index in Job._meta.indexes if tuple(index.fields) == fields)


CLAIM_INDEX = _index("status", *CLAIM_ORDER_COLUMNS)
QUEUE_INDEX = _index("status", "queue", *CLAIM_ORDER_COLUMNS)
DUE_INDEX = _index("status", "next_run_at", "priority")


def placeholders(n: int) -> str:
    return ", ".join(["%s"] * n)


def one_queue(queues: Sequence[str] | None) -> bool:
    """A worker that serves one queue claims through the queue index, led by queue: its bands are
    ranges within the queue, so other queues' due and future rows lie outside them (tests/
    test_explain.py test_a_one_queue_claim_reads_only_its_queue_with_a_million_rows_in_another).
    Several queues share the claim index and filter its ranges by queue."""
    return queues is not None and len(queues) == 1


#: No condition: what the filters below return when there is nothing to filter (never changed).
NOTHING = Sql()


def queue_filter(queues: Sequence[str] | None) -> Sql:
    """``AND queue ...`` for ``queues`` (nothing when None), as bound parameters."""
    if not queues:
        return NOTHING
    if one_queue(queues):  # an equality: the queue index's ranges
        return Sql(" AND queue = %s", queues)
    return Sql(f" AND queue IN ({placeholders(len(queues))})", queues)


def below_filter(below: int | None) -> Sql:
    return Sql(" AND priority < %s", [below]) if below is not None else NOTHING


def after_point(point: tuple[Any, ...]) -> Sql:
    """Rows after ``point``, a row's (priority, next_run_at, created_at, id), within its band:
    ``AND (priority <> p OR next_run_at > n OR (next_run_at = n AND (...)))``. Written as ORs,
    which MariaDB's range optimizer turns into index ranges over all the claim index's columns
    (a row comparison it uses for its first column only); the point bounds only its own band
    (tests/test_explain.py test_a_resumed_claim_is_one_index_range_over_all_five_columns)."""
    return Sql(_AFTER.text, [point[i] for i in _AFTER.params])


def _after(columns: Sequence[str], values: Sequence[Any]) -> Sql:
    """``c1 > v1 OR (c1 = v1 AND (c2 > v2 OR (...)))``: the rows after ``values`` in ``columns``' order."""
    sql = Sql(f"{columns[0]} > %s", [values[0]])
    if len(columns) == 1:
        return sql
    rest = _after(columns[1:], values[1:])
    if len(columns) > 2:
        rest = Sql("(").join(rest).add(")")
    return sql.add(f" OR ({columns[0]} = %s AND ", values[0]).join(rest).add(")")


def _after_template() -> Sql:
    """after_point's text, with the index in the point of each parameter as the parameter."""
    (band, *rest), (band_index, *indexes) = CLAIM_ORDER_COLUMNS, range(len(CLAIM_ORDER_COLUMNS))
    return Sql(f" AND ({band} <> %s OR ", [band_index]).join(_after(rest, indexes)).add(")")


_AFTER = _after_template()


class Statements:
    """The statement builders; the hooks (methods that return a hint or a part) are overridden
    by the backends whose SQL differs."""

    #: Appended to a claim's select on databases that lock its rows while marking them.
    claim_lock = ""
    #: What a claim's select returns for its UPDATE to find each row by (claim_update).
    claim_key = "id"
    #: The function that picks the larger of two values (SQLite's is the scalar MAX).
    greatest = "GREATEST"
    #: And the smaller (SQLite's is the scalar MIN).
    least = "LEAST"

    def upsert_adding(
        self,
        table: str,
        keys: Sequence[str],
        adds: Sequence[str],
        maxes: Sequence[str],
        rows: Sequence[Sequence[Any]],
    ) -> Sql:
        """One INSERT of ``rows`` (keys, adds, maxes in that order); a row whose keys are stored
        already adds its ``adds`` to the stored ones and keeps the larger of each of ``maxes``
        (the metrics' per-minute counters: metrics.py)."""
        sets = [f"{c} = {table}.{c} + excluded.{c}" for c in adds]
        sets += [f"{c} = {self.greatest}({table}.{c}, excluded.{c})" for c in maxes]
        return self._insert_rows(table, [*keys, *adds, *maxes], rows).add(
            f" ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {', '.join(sets)}"
        )

    def upsert_replacing(
        self, table: str, keys: Sequence[str], values: Sequence[str], rows: Sequence[Sequence[Any]]
    ) -> Sql:
        """One INSERT of ``rows`` (keys, then values); a row whose keys are stored already has its
        ``values`` replaced. Unlike a DELETE then an INSERT, it takes no lock on the gap where an
        absent row would be, which MariaDB/MySQL take at REPEATABLE READ: two such writes of
        different keys never wait for each other (outputs.keep;
        tests/test_batches.py::test_records_of_two_members_do_not_wait_for_each_other)."""
        sets = [f"{c} = excluded.{c}" for c in values]
        return self._insert_rows(table, [*keys, *values], rows).add(
            f" ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {', '.join(sets)}"
        )

    #: Whether ``replace_job`` returns the row it inserted or changed (id, status).
    replace_returns = True

    def replace_job(self, params: Sequence[Any], due_by: int | None, max_delay: int | None) -> Sql:
        """Insert a unique job (prepare's row, with ``due_by``), or give the waiting job holding
        its key its payload and options, its due time capped at its burst's (``max_delay``
        seconds after its enqueue, unless it has a cap): one statement, which returns the row's
        (id, status), none when the holder does not wait (api/enqueue_once.py)."""
        return Sql(self.replace_job_sql, [*params, due_by, max_delay, max_delay])

    @cached_property
    def replace_job_sql(self) -> str:
        """replace_job's text, made once per connection's backend."""
        sets = ", ".join(f"{c} = excluded.{c}" for c in REPLACED)
        return (
            f"{INSERT_HEAD.replace(') VALUES ', ', due_by) VALUES ')}{INSERT_VALUES[:-1]}, %s) "
            f"ON CONFLICT (unique_hash) DO UPDATE SET {sets}, "
            f"next_run_at = {self.least}(excluded.next_run_at, "
            "COALESCE(rws_jobs.due_by, rws_jobs.created_at + %s, excluded.next_run_at)), "
            "due_by = COALESCE(rws_jobs.due_by, rws_jobs.created_at + %s) "
            f"WHERE rws_jobs.status IN {WAITS} RETURNING id, status"
        )

    def take_window(self, digest: str, job_id: str, now: int, until: int) -> Sql:
        """Take a throttle's window (rws_unique_windows) for ``job_id`` until ``until`` unless an
        open one (``until`` past ``now``) holds it: one statement that locks the key's row, so two
        takers never both win and never wait on each other's gap locks (api/enqueue_once.py)."""
        return Sql(
            "INSERT INTO rws_unique_windows (unique_hash, job_id, until) VALUES (%s, %s, %s) "
            "ON CONFLICT (unique_hash) DO UPDATE SET job_id = excluded.job_id, until = excluded.until "
            "WHERE rws_unique_windows.until <= %s",
            [digest, job_id, until, now],
        )

    def _insert_rows(self, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> Sql:
        row = "(" + ", ".join(["%s"] * len(columns)) + ")"
        return Sql(
            f"INSERT INTO {table} ({', '.join(columns)}) VALUES {', '.join([row] * len(rows))}",
            [value for r in rows for value in r],
        )

    def claim_index_hint(self, queues: Sequence[str] | None) -> str:
        return ""

    def due_index_hint(self) -> str:
        return ""

    def queue_index_hint(self) -> str:
        """Appended to the table's name in a read of one queue's rows by status (rws_health's
        walk of the due rows): the queue index, where the database takes hints."""
        return ""

    def running_index_hint(self) -> str:
        return ""

    def primary_key_hint(self) -> str:
        """Appended to a table's name in a write that names its rows by primary key, where the
        planner could walk another index instead: a write that walks an index meets the rows
        other transactions inserted and have not committed, and MariaDB waits for them
        (dependency_outcomes.ended)."""
        return ""

    def claim_queue_filter(self, queues: Sequence[str] | None) -> Sql:
        """The queue filter of the statements a worker prepares (the claim, the band walk)."""
        return queue_filter(queues)

    def concat(self, *parts: str) -> str:
        return " || ".join(parts)

    # -- the claim --------------------------------------------------------------------------------

    def band_select(
        self,
        columns: str,
        queues: Sequence[str] | None,
        band: Sql,
        now: int,
        limit: int,
        after: tuple[Any, ...] | None = None,
    ) -> Sql:
        """Due jobs of the band ``band`` (a predicate on priority: ``in_band`` or ``in_top_band``)
        in claim order, after the point ``after`` if given: one range of the claim index,
        stopped by LIMIT.

        LIMIT is written into the statement, not bound: a prepared statement's generic plan for
        an unknown LIMIT reads the whole table (tests/test_explain.py
        assert_prepared_claims_are_index_ranges). A worker uses few limits (1 to its thread
        count), so this makes few statements.
        """
        return self.band_end(self.band_range(columns, queues, band, now), limit, after)

    def band_range(self, columns: str, queues: Sequence[str] | None, band: Sql, now: int) -> Sql:
        """band_select up to its start point and order."""
        sql = Sql(
            f"SELECT {columns} FROM rws_jobs{self.claim_index_hint(queues)} WHERE status = 'pending' AND "
        )
        return sql.join(band).add(" AND next_run_at <= %s", now).join(self.claim_queue_filter(queues))

    def band_end(self, band_range: Sql, limit: int, after: tuple[Any, ...] | None = None) -> Sql:
        """A new statement: ``band_range``, then the start point, the order and the limit."""
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ValueError(f"limit must be a positive int, got {limit!r}")
        sql = Sql(band_range.text, band_range.params)
        if after is not None:
            sql.join(after_point(after))
        return sql.add(f" ORDER BY {BAND_ORDER_ASC} LIMIT {limit}")

    def in_band(self, priority: int) -> Sql:
        return Sql("priority = %s", [priority])

    def in_top_band(self, queues: Sequence[str] | None, below: int | None) -> Sql:
        """The highest band (below ``below``), found by a subquery of the claim itself."""
        return Sql("priority = (").join(self.top_priority_select(queues, below)).add(")")

    def top_priority_select(self, queues: Sequence[str] | None, below: int | None) -> Sql:
        """The highest priority among pending jobs (below ``below``): one probe of the claim index."""
        sql = Sql("SELECT MAX(priority) FROM rws_jobs WHERE status = 'pending'").join(below_filter(below))
        return sql.join(self.claim_queue_filter(queues))

    def claim_update(self, select: Sql, token: str, lease_until: int, now: int, locks: bool = False) -> Sql:
        """Mark the rows ``select`` finds as claimed by ``token``, in one statement; ``claim_lock``
        is added to ``select`` unless it ``locks`` the rows itself."""
        sql = Sql(f"UPDATE rws_jobs SET {CLAIM_SET} WHERE id IN (", [token, lease_until, now]).join(select)
        return sql.add(f"{'' if locks else self.claim_lock}) RETURNING {CLAIM_COLUMNS}")

    # -- finding the band -------------------------------------------------------------------------

    def due_band_select(self, queues: Sequence[str] | None, below: int | None, now: int) -> Sql:
        """Read-only: the highest band (below ``below``) that holds a due job, in one statement.

        Walks the pending bands from the top, one probe of the claim index for the next band and
        one for a due job in it, and stops at the first band with a due job, at the last band, or
        after MAX_BAND_WALK bands. Returns one row (priority, due, passed): (p, true, ...) is the
        band to claim from; (NULL, ...) says nothing is due there; (p, false, ...) says the walk
        gave up at band p, and ``top_due_band_select`` below p finds the band; ``passed`` whether
        it passed bands that hold only future jobs. One round trip however many such bands there
        are (tests/test_explain.py assert_band_walk).
        """
        qsql = self.claim_queue_filter(queues)
        # The due time of the band's first job in claim order, the first entry of its range: a
        # scalar subquery, which no planner turns into a join over every due row (PostgreSQL did
        # with NOT EXISTS). In the claim's whole order, which only the claim index has.
        first = Sql("(SELECT next_run_at FROM rws_jobs WHERE status = 'pending' AND priority = bands.p")
        first.join(qsql).add(f" ORDER BY {BAND_ORDER} LIMIT 1)")
        # The next band: the last entry of a range of the claim index, read backwards. (With MAX,
        # PostgreSQL may read the due index's whole pending range instead, dead entries and all:
        # tests/test_explain.py
        # test_a_resumed_claim_that_comes_back_short_reads_no_dead_entry_before_its_point.)
        next_band = " ORDER BY priority DESC LIMIT 1)"
        sql = (
            Sql("WITH RECURSIVE bands (p, n) AS (SELECT (SELECT priority FROM rws_jobs ")
            .add("WHERE status = 'pending'")
            .join(below_filter(below))
            .join(qsql)
            .add(next_band + ", 1 UNION ALL ")
        )
        sql.add("SELECT (SELECT priority FROM rws_jobs WHERE status = 'pending' AND priority < bands.p")
        sql.join(qsql).add(next_band + ", n + 1 ")
        sql.add(f"FROM bands WHERE bands.p IS NOT NULL AND n < {MAX_BAND_WALK} AND ").join(first)
        sql.add(" > %s) SELECT p, ", now).join(first)
        return sql.add(" <= %s, n > 1 FROM bands ORDER BY n DESC LIMIT 1", now)

    def any_due_select(self, queues: Sequence[str] | None, now: int) -> Sql:
        """Read-only: is any job due? One probe of the due index, however many bands there are."""
        sql = Sql(
            f"SELECT 1 FROM rws_jobs{self.due_index_hint()} WHERE status = 'pending' AND next_run_at <= %s",
            [now],
        )
        return sql.join(queue_filter(queues)).add(" LIMIT 1")

    def top_due_band_select(self, queues: Sequence[str] | None, below: int | None, now: int) -> Sql:
        """The highest priority among due jobs: a scan of the due rows, for when walking the bands
        from the top would pass many that hold only future jobs."""
        return self.due_rows("MAX(priority)", queues, below, now)

    def due_rows(self, columns: str, queues: Sequence[str] | None, below: int | None, now: int) -> Sql:
        """``columns`` of the due rows (below ``below``), read from the due index."""
        sql = Sql(
            f"SELECT {columns} FROM rws_jobs{self.due_index_hint()} WHERE status = 'pending' "
            "AND next_run_at <= %s",
            [now],
        )
        return sql.join(below_filter(below)).join(queue_filter(queues))

    # -- completions and leases -------------------------------------------------------------------

    def complete_delete(self, ids: Sequence[str], token: str) -> Sql:
        """Delete finished jobs that the claim ``token`` still holds.

        By primary key: "(status = 'running') IS TRUE" is no index condition, so no planner reads
        the claim index's 'running' entries, the deleted rows' too (tests/test_explain.py
        assert_completion_by_primary_key).
        """
        return Sql(
            f"DELETE FROM rws_jobs WHERE id IN ({placeholders(len(ids))}) AND locked_by = %s "
            "AND (status = 'running') IS TRUE",
            [*ids, token],
        )

    def renew_update(self, tokens: Sequence[str], until: int) -> Sql:
        held = f"locked_by IN ({placeholders(len(tokens))})"
        return Sql(
            f"UPDATE rws_jobs{self.running_index_hint()} SET locked_until = %s "
            f"WHERE status = 'running' AND {held}",
            [until, *tokens],
        )

    def expired_select(self, now: int, limit: int) -> Sql:
        """Running jobs whose lease ran out, each row a Claimed's fields with its holder as token."""
        return Sql(
            f"SELECT {CLAIM_COLUMNS}, locked_by FROM rws_jobs{self.running_index_hint()} "
            "WHERE status = 'running' AND locked_until < %s ORDER BY locked_until LIMIT %s",
            [now, limit],
        )
