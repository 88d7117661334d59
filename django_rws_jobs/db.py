"""Database plumbing: connections, SQLite set-up and short transactions on any connection."""

from __future__ import annotations

import logging
import threading
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Iterator

from django.db import InterfaceError, InternalError, OperationalError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from .conf import jobs_settings

logger = logging.getLogger("django_rws_jobs")

#: Busy timeout (ms) given to SQLite connections whose settings name none: several worker
#: processes and a web process share one file, and a writer waits for another rather than fail.
SQLITE_BUSY_TIMEOUT_MS = 30_000

_thread = threading.local()

#: psycopg's prepare_threshold for the worker's PostgreSQL connections: only statements executed
#: with ``prepare=True`` (the hot ones, see store.Store) are prepared.
PREPARE_WHEN_ASKED = 2**31 - 1


def thread_connected() -> bool:
    """True once the calling thread has opened a database connection (Django's or a private one).

    A worker's executor thread asks this after each job: while its handlers never touched the
    database there is nothing for ``close_old_connections()`` to look at, and skipping it saves
    most of a no-op job's cost.
    """
    return getattr(_thread, "connected", False)


def configure_connection(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    """Set up new connections: the queue's SQLite ones for sharing, the worker's PostgreSQL ones
    for speed."""
    _thread.connected = True
    if connection.vendor == "sqlite" and sets_up_sqlite(connection):
        configure_sqlite(connection)
    elif connection.vendor == "postgresql" and getattr(connection, "rws_private", False):
        # (SETs, not startup options, so that PgBouncer accepts them.)
        with connection.cursor() as cursor:
            # The worker's statements are all ranges of an index that already has their order,
            # and some are prepared. Planners misjudge a queue table: a plan made once for any
            # parameters while it held a few rows would read the whole table once it holds a
            # million, and with statistics from before a burst of jobs enqueued in one second the
            # claim read every due row of the due index and sorted them (13 ms instead of 1).
            # Without sequential scans and sorts the planner keeps to the claim index whatever
            # the table's size and statistics (tests/test_explain.py). A plan that must sort
            # anyway (the band walk's last row) is then priced above jit_above_cost: without JIT
            # off, PostgreSQL compiled it, 170 ms for a statement that runs in 0.1 ms (measured).
            cursor.execute("SELECT set_config('enable_seqscan', 'off', false), "
                           "set_config('enable_sort', 'off', false), "
                           "set_config('enable_incremental_sort', 'off', false), "
                           "set_config('jit', 'off', false)")
            if not jobs_settings.WORKER_SYNCHRONOUS_COMMIT:
                # Claims and outcomes need not wait for the WAL flush: a database crash can only
                # undo the last of them, and an undone claim or outcome makes a job run again
                # (the at-least-once promise), never lose it. Enqueues keep the project's
                # durability.
                cursor.execute("SET synchronous_commit TO off")


def sets_up_sqlite(connection: BaseDatabaseWrapper) -> bool:
    """Whether ``connection`` gets the SQLite set-up: the worker's own connections, and Django's
    to the queue's alias or to one the project names in RWS_JOBS["SQLITE_SETUP_ALIASES"]. The
    project's other SQLite databases keep their own settings (tests/test_sqlite.py
    test_other_sqlite_aliases_keep_their_settings)."""
    if getattr(connection, "rws_private", False) or connection.alias == jobs_settings.DATABASE:
        return True
    extra = jobs_settings.SQLITE_SETUP_ALIASES
    return isinstance(extra, (list, tuple)) and connection.alias in extra


def configure_sqlite(connection: BaseDatabaseWrapper) -> None:
    """Put file-backed SQLite databases in WAL mode with a busy timeout, unless the user chose."""
    options = connection.settings_dict.get("OPTIONS", {})
    init = (options.get("init_command") or "").lower()
    if "transaction_mode" not in options:
        # A deferred transaction that reads, then writes, fails at once with "database is locked"
        # when another process wrote meanwhile; IMMEDIATE takes the write lock at BEGIN and waits.
        connection.transaction_mode = "IMMEDIATE"
    with connection.cursor() as cursor:
        if "timeout" not in options and "busy_timeout" not in init:
            cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        if "journal_mode" not in init and not connection.is_in_memory_db():
            cursor.execute("PRAGMA journal_mode")
            if cursor.fetchone()[0].lower() != "wal":
                cursor.execute("PRAGMA journal_mode = WAL")
            if "synchronous" not in init:
                # In WAL mode NORMAL stays consistent after a crash of the process or the OS; only
                # a power loss may forget the last commits. It saves an fsync per commit.
                cursor.execute("PRAGMA synchronous = NORMAL")


def queue_alias(using: str | None = None) -> str:
    alias = using if using is not None else jobs_settings.DATABASE
    if not isinstance(alias, str) or alias not in connections.settings:
        raise ValueError(
            f"database alias {alias!r} is not in DATABASES (known: {', '.join(connections.settings)})"
        )
    return alias


def private_connection(alias: str) -> BaseDatabaseWrapper:
    """A connection of our own to ``alias``, outside Django's per-thread handling.

    ``close_old_connections()`` around a job never closes it, so the worker's bookkeeping does not
    reconnect for every job.
    """
    conn = connections.create_connection(alias)
    options = dict(conn.settings_dict.get("OPTIONS", {}))
    if conn.vendor == "postgresql":
        # The same few statements run for every job: the Store prepares them (and only them: a
        # threshold no statement reaches keeps psycopg from preparing anything else, whose generic
        # plan nobody checked), so PostgreSQL stops planning each one anew. A project behind a
        # pooler that cannot keep prepared statements sets OPTIONS["server_side_binding"] = False.
        options.setdefault("server_side_binding", True)
        if options["server_side_binding"] is True:
            options.setdefault("prepare_threshold", PREPARE_WHEN_ASKED)
    elif conn.vendor == "mysql":
        # Under REPEATABLE READ, InnoDB keeps locks on rows a claim read but did not take (other
        # queues' jobs), and other workers' SKIP LOCKED would pass them over.
        options.setdefault("isolation_level", "read committed")
        # The claim sends BEGIN with its first statement and COMMIT with its last (two round trips
        # fewer) where the driver allows several statements per call: mysqlclient does unless
        # told not to (PyMySQL does not; see sends_several). Only this module's statements run on
        # this connection, their parameters escaped by the driver.
        options.pop("multi_statements", None)
    conn.settings_dict = {**conn.settings_dict, "OPTIONS": options}
    conn.rws_private = True  # type: ignore[attr-defined]  (see configure_connection)
    return conn


#: The protocol's CLIENT_MULTI_STATEMENTS capability flag.
CLIENT_MULTI_STATEMENTS = 1 << 16


def sends_several(conn: BaseDatabaseWrapper) -> bool:
    """MariaDB/MySQL: whether ``conn``'s driver connection accepts several statements in one call.

    Asked of the client flags the connection was opened with (mysqlclient sets the flag by
    default, PyMySQL does not), not of the driver's name. The claim sends single statements
    where it is off (tests/test_tick.py test_under_pymysql_the_worker_claims_with_one_statement_per_call;
    the dj6:pymysql cell of scripts/test runs the MariaDB tests through PyMySQL).
    """
    raw = conn.connection
    return bool(getattr(raw, "client_flag", 0) & CLIENT_MULTI_STATEMENTS)


def max_statement_bytes(conn: BaseDatabaseWrapper) -> int:
    """MariaDB/MySQL: the longest statement the server takes (its ``max_allowed_packet`` less
    the packet's command byte), read once per driver connection."""
    conn.ensure_connection()
    kept = getattr(conn, "_rws_max_packet", None)
    if kept is None or kept[0] is not conn.connection:
        with conn.cursor() as c:
            c.execute("SELECT @@max_allowed_packet")
            kept = (conn.connection, int(c.fetchone()[0]) - 1)
        conn._rws_max_packet = kept  # type: ignore[attr-defined]
    return kept[1]


_sqlite_locks: dict[str, threading.RLock] = {}
_sqlite_locks_guard = threading.Lock()


def write_lock(conn: BaseDatabaseWrapper) -> AbstractContextManager[Any]:
    """What the worker's private connections to one SQLite file hold around their writes.

    SQLite lets one connection write at a time, and one that finds the file locked sleeps in its
    busy handler, 1 ms and more, however soon the writer is done. Within a worker process the
    dispatcher's claim and the completer's delete met that way at nearly every claim (claim
    p50 1.4 ms instead of 0.25 ms, and half the drain's rate, measured): a lock of the process's
    own makes the second writer wait only as long as the first writes. Other processes' writers
    still meet in SQLite's busy handler. Elsewhere, and on connections that are not the worker's
    own, nothing is held.
    """
    if conn.vendor != "sqlite" or not getattr(conn, "rws_private", False) or conn.is_in_memory_db():
        return nullcontext()
    name = str(conn.settings_dict["NAME"])
    with _sqlite_locks_guard:
        return _sqlite_locks.setdefault(name, threading.RLock())


def is_registered(conn: BaseDatabaseWrapper) -> bool:
    """True for the calling thread's own Django connection to conn.alias."""
    # The worker's own connections never are, and asking ``connections`` (a thread-critical
    # local) cost more than a SQLite claim's statements.
    return not getattr(conn, "rws_private", False) and connections[conn.alias] is conn


@contextmanager
def atomic(conn: BaseDatabaseWrapper, *, write: bool = True, cursor: Any = None) -> Iterator[None]:
    """A short transaction on ``conn`` (a savepoint inside the caller's, on Django's connection).

    ``cursor``: a context manager that gives the cursor to send BEGIN and COMMIT with (a Store's
    kept one); by default a new cursor of ``conn``.
    """
    if is_registered(conn):
        with transaction.atomic(using=conn.alias):
            yield
        return
    begin = "BEGIN IMMEDIATE" if conn.vendor == "sqlite" and write else "BEGIN"
    with cursor if cursor is not None else conn.cursor() as c:
        c.execute(begin)
        try:
            yield
        except BaseException:
            c.execute("ROLLBACK")
            raise
        c.execute("COMMIT")


#: MySQL/MariaDB error numbers that retrying cannot fix: access denied (1044, 1045, 1142, 1143,
#: 1227), no database (1046, 1049), an unknown table or column (1054, 1146), a syntax error (1064,
#: 1149). Most reach Python as OperationalError, like a lost connection.
MYSQL_PERMANENT = frozenset({1044, 1045, 1046, 1049, 1054, 1064, 1142, 1143, 1146, 1149, 1227})
#: SQLite result codes (the low byte) that retrying cannot fix: SQLITE_ERROR (a missing table or
#: column, a syntax error), SQLITE_READONLY, SQLITE_CORRUPT, SQLITE_NOTADB, SQLITE_AUTH.
SQLITE_PERMANENT = frozenset({1, 8, 11, 23, 26})
#: The same, told by their messages where Python (before 3.11) gives no result code.
SQLITE_PERMANENT_MESSAGES = ("no such table", "no such column", "syntax error", "has no column named",
                             "attempt to write a readonly database", "file is not a database",
                             "database disk image is malformed", "not authorized")


def is_transient(exc: BaseException) -> bool:
    """True for a database error that may pass by itself: a lost connection, a server that
    restarts, a lock or deadlock timeout. False for one that retrying cannot fix: a missing table
    or column, a syntax error, a permission, a value the database refuses (DataError,
    IntegrityError). Pinned by tests/test_faults.py::test_error_kinds."""
    if isinstance(exc, (InterfaceError, InternalError)):
        return True  # a closed connection; PostgreSQL's aborted transaction (reconnecting ends it)
    if not isinstance(exc, OperationalError):
        return False
    cause = exc.__cause__
    code = getattr(cause, "args", (None,))[0] if cause is not None else None
    if type(cause).__module__.startswith(("MySQLdb", "pymysql")) and isinstance(code, int):
        return code not in MYSQL_PERMANENT
    sqlite_code = getattr(cause, "sqlite_errorcode", None)
    if isinstance(sqlite_code, int):
        return sqlite_code & 0xFF not in SQLITE_PERMANENT
    message = str(exc).lower()
    return not any(m in message for m in SQLITE_PERMANENT_MESSAGES)
