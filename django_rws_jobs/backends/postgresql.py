"""PostgreSQL: claims with FOR UPDATE SKIP LOCKED, prepared hot statements, COPY for bulk enqueues."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import cached_property
from typing import Any

from ..conf import jobs_settings
from .base import BaseBackend, BaseFeatures
from .inserts import COPY_SQL
from .statements import Sql, queue_filter

#: psycopg's prepare_threshold for the worker's connections: only statements executed with
#: ``prepare=True`` (the hot ones, see Store.execute) are prepared.
PREPARE_WHEN_ASKED = 2**31 - 1
#: The SQLSTATE of a statement stopped by statement_timeout.
QUERY_CANCELED = "57014"


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


class PostgreSQLFeatures(BaseFeatures):
    wakeup = "listen"
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

    def claim_queue_filter(self, queues: Sequence[str] | None) -> Sql:
        """One queue is written into the claim, which is prepared: a generic plan for any queue
        weighs the queue by the table's average and keeps to the claim index, reading other
        queues' rows. An E'' literal escapes the same whatever standard_conforming_strings says;
        "%" is doubled for the driver's placeholder syntax (tests/test_exact_match.py)."""
        if queues and len(queues) == 1:
            text = queues[0].replace("\\", "\\\\").replace("'", "''").replace("%", "%%")
            return Sql(f" AND queue = E'{text}'")
        return queue_filter(queues)

    def top_due_band_select(self, queues: Sequence[str] | None, below: int | None, now: int) -> Sql:
        # Left to itself PostgreSQL reads the claim index backwards for MAX, through every future
        # row of the bands above; OFFSET 0 keeps the due rows a query of their own.
        due = self.due_rows("priority", queues, below, now)
        return Sql("SELECT MAX(priority) FROM (").join(due).add(" OFFSET 0) AS due")

    def configure_session(self) -> None:
        if not getattr(self.conn, "rws_private", False):
            return
        # (SETs, not startup options, so that PgBouncer accepts them.)
        with self.conn.cursor() as cursor:
            # The worker's statements are all ranges of an index that already has their order,
            # and some are prepared. A plan made once for any parameters while the table held a
            # few rows would read the whole table once it holds a million, and with statistics
            # from before a burst of enqueues the claim read every due row and sorted them.
            # Without sequential scans and sorts the planner keeps to the claim index whatever
            # the table's size and statistics (tests/test_explain.py). A plan that must sort
            # anyway (the band walk's last row) is then priced above jit_above_cost: JIT is off,
            # or PostgreSQL would compile it, many times the statement's own time.
            cursor.execute(
                "SELECT set_config('enable_seqscan', 'off', false), "
                "set_config('enable_sort', 'off', false), "
                "set_config('enable_incremental_sort', 'off', false), "
                "set_config('jit', 'off', false)"
            )
            if not jobs_settings.WORKER_SYNCHRONOUS_COMMIT:
                # Claims and outcomes need not wait for the WAL flush: a database crash can only
                # undo the last of them, and an undone claim or outcome makes a job run again
                # (the at-least-once promise), never lose it. Enqueues keep the project's
                # durability.
                cursor.execute("SET synchronous_commit TO off")

    @contextmanager
    def time_limit(self, seconds: float) -> Iterator[None]:
        with self.conn.cursor() as c:
            c.execute("SELECT current_setting('statement_timeout')")
            (before,) = c.fetchone()
            c.execute(
                "SELECT set_config('statement_timeout', %s, false)", [f"{max(1, round(seconds * 1000))}ms"]
            )
        try:
            yield
        finally:
            with self.conn.cursor() as c:
                c.execute("SELECT set_config('statement_timeout', %s, false)", [before])

    def is_time_limit_error(self, exc: BaseException) -> bool:
        cause = exc.__cause__
        return (getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)) == QUERY_CANCELED

    def private_options(self, options: dict[str, Any]) -> dict[str, Any]:
        # The same few statements run for every job: the Store prepares them (and only them: a
        # threshold no statement reaches keeps psycopg from preparing anything else, whose generic
        # plan nobody checked), so PostgreSQL stops planning each one anew. A project behind a
        # pooler that cannot keep prepared statements sets OPTIONS["server_side_binding"] = False.
        # A peer that vanished (a dropped NAT entry, a firewall that drops packets) is noticed by
        # TCP within seconds instead of Linux's two hours; a project's own values are kept.
        for key, value in DEAD_PEER_OPTIONS.items():
            options.setdefault(key, value)
        options.setdefault("server_side_binding", True)
        if options["server_side_binding"] is True:
            options.setdefault("prepare_threshold", PREPARE_WHEN_ASKED)
        return options

    def prepares_statements(self) -> bool:
        # Only where private_options() turned on server-side binding, so OPTIONS
        # ["server_side_binding"] = False (behind a pooler) turns this off too.
        conn = self.conn
        return (
            getattr(conn, "rws_private", False)
            and _is_psycopg3()
            and conn.settings_dict.get("OPTIONS", {}).get("server_side_binding") is True
        )

    def insert_many(
        self, c: Any, rows: Iterator[list[Any]], batch_size: int, where: Callable[[], str], watched: bool
    ) -> None:
        if self.features.bulk_insert != "copy" or watched:
            return super().insert_many(c, rows, batch_size, where, watched)
        # COPY streams the rows: several times faster than multi-row INSERTs (docs/benchmarks.md).
        with self.conn.wrap_database_errors, c.cursor.copy(COPY_SQL) as copy:
            for row in rows:
                copy.write_row(row)
