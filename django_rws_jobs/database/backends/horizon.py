"""What holds back the cleanup of the queue's table, read per database (BaseBackend.horizon).

Every job leaves dead row versions (its pending row after the claim, its running row after the
delete). While a transaction keeps an old snapshot open, the database cannot remove them, and
every claim walks them (docs/howto/databases.md, "Long transactions"). These reads show it coming:
rws_health --max-snapshot-age / --max-dead-rows / --max-wal-bytes and the metrics endpoint. Each
is a few rows of the server's own statistics, off the per-job path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


@dataclass
class Holder:
    """Who holds the oldest snapshot: a session (pid, user, state, when its transaction and its
    current or last statement began, unix seconds)."""

    pid: int
    user: str
    state: str
    xact_start: float | None
    query_start: float | None

    def describe(self) -> str:
        return f"pid {self.pid}, user {self.user!r}, {self.state or 'state unknown'}"


@dataclass
class Horizon:
    """What one read found; None: not measured on this database.

    ``snapshot_age``: seconds the oldest transaction that holds back the cleanup of the queue's
    rows has been open (0 when none is), ``holder`` its session. ``slots``: (slot, "xmin" or
    "catalog_xmin", age in transactions) of the PostgreSQL replication slots that hold one.
    ``dead_rows``: the queue table's dead row versions (PostgreSQL's ``n_dead_tup``).
    ``undo_history``: InnoDB's history list length (undo logs not purged yet, for every table; the
    server refreshes it about each second).
    ``wal_bytes``: the size of SQLite's ``-wal`` file."""

    snapshot_age: float | None = None
    holder: Holder | None = None
    slots: list[tuple[str, str, int]] | None = None
    dead_rows: int | None = None
    undo_history: int | None = None
    wal_bytes: int | None = None


#: The sessions of this database with a snapshot (backend_xmin) or a transaction id
#: (backend_xid), oldest transaction first; this session left out. A session that does not
#: belong to the reader's role shows none of these columns without pg_read_all_stats.
POSTGRESQL_OLDEST = """
SELECT pid, usename, state, EXTRACT(EPOCH FROM xact_start), EXTRACT(EPOCH FROM query_start),
       EXTRACT(EPOCH FROM (clock_timestamp() - xact_start))
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()
  AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL) AND xact_start IS NOT NULL
ORDER BY xact_start LIMIT 1
"""
POSTGRESQL_SLOTS = """
SELECT slot_name, age(xmin), age(catalog_xmin) FROM pg_replication_slots
WHERE (database IS NULL OR database = current_database())
  AND (xmin IS NOT NULL OR catalog_xmin IS NOT NULL) ORDER BY slot_name
"""
POSTGRESQL_DEAD = (
    "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'rws_jobs' "
    "AND schemaname = ANY (current_schemas(false)) ORDER BY schemaname LIMIT 1"
)


def postgresql(c: Any) -> Horizon:
    """Three statements on the cursor ``c``."""
    found = Horizon(snapshot_age=0.0)
    c.execute(POSTGRESQL_OLDEST)
    row = c.fetchone()
    if row is not None:
        pid, user, state, xact_start, query_start, age = row
        found.snapshot_age = float(age)
        found.holder = Holder(pid, user or "", state or "", _float(xact_start), _float(query_start))
    c.execute(POSTGRESQL_SLOTS)
    found.slots = [
        (name, kind, int(age))
        for name, xmin_age, catalog_age in c.fetchall()
        for kind, age in (("xmin", xmin_age), ("catalog_xmin", catalog_age))
        if age is not None
    ]
    c.execute(POSTGRESQL_DEAD)
    dead = c.fetchone()
    found.dead_rows = int(dead[0]) if dead is not None else 0
    return found


#: The oldest InnoDB transaction that may hold a read view, which purge may not pass: one in
#: REPEATABLE READ or SERIALIZABLE (its read view lasts until it ends), or one running a statement
#: (under READ COMMITTED, Django's default on MySQL, the read view lasts one statement); this
#: session's left out (tests/test_horizon.py).
MYSQL_OLDEST = """
SELECT t.trx_mysql_thread_id, COALESCE(p.USER, ''), COALESCE(p.COMMAND, ''), t.trx_state,
       UNIX_TIMESTAMP(t.trx_started), TIMESTAMPDIFF(MICROSECOND, t.trx_started, NOW(6)) / 1e6,
       UNIX_TIMESTAMP() - p.TIME
FROM information_schema.INNODB_TRX t
LEFT JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id
WHERE t.trx_mysql_thread_id <> CONNECTION_ID()
  AND (t.trx_isolation_level IN ('REPEATABLE READ', 'SERIALIZABLE') OR t.trx_query IS NOT NULL)
ORDER BY t.trx_started LIMIT 1
"""
MYSQL_HISTORY = "SELECT `COUNT` FROM information_schema.INNODB_METRICS WHERE NAME = 'trx_rseg_history_len'"


def mysql(c: Any) -> Horizon:
    """Two statements on the cursor ``c`` (the PROCESS privilege shows other users' sessions)."""
    found = Horizon(snapshot_age=0.0)
    c.execute(MYSQL_OLDEST)
    row = c.fetchone()
    if row is not None:
        pid, user, command, state, started, age, since = row
        found.snapshot_age = max(float(age), 0.0)
        described = f"{command} ({state})" if command else state
        found.holder = Holder(int(pid), user, described, _float(started), _float(since))
    c.execute(MYSQL_HISTORY)
    history = c.fetchone()
    found.undo_history = int(history[0]) if history is not None else None
    return found


def sqlite(conn: Any) -> Horizon:
    """The size of the database's ``-wal`` file (0 when there is none; not measured in memory)."""
    name = str(conn.settings_dict.get("NAME") or "")
    if not name or conn.is_in_memory_db():
        return Horizon()
    try:
        size = os.stat(name + "-wal").st_size
    except FileNotFoundError:
        size = 0
    return Horizon(wal_bytes=size)


def _float(value: Any) -> float | None:
    return None if value is None else float(value)
