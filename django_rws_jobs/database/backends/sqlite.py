"""SQLite: one writer at a time, in WAL mode, shared by the worker's threads and other processes."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from ...conf import jobs_settings
from . import horizon
from .base import BaseBackend, BaseFeatures
from .cursors import DriverCursor
from .statements import DUE_INDEX, QUEUE_INDEX

#: Busy timeout (ms) given to SQLite connections whose settings name none: several worker
#: processes and a web process share one file, and a writer waits for another rather than fail.
SQLITE_BUSY_TIMEOUT_MS = 30_000

#: SQLite virtual machine steps between two looks at a time limit's clock.
PROGRESS_STEPS = 100

_write_locks: dict[str, threading.RLock] = {}
_write_locks_guard = threading.Lock()


class SQLiteFeatures(BaseFeatures):
    # One writer at a time: a commit and a turn at the write lock fewer per batch
    # (tests/test_worker.py, docs/design.md "SQLite").
    serializes_writes = True
    deletes_with_claim = True
    wakeup = "data_version"
    adopts_by_rebuild = True
    failed_commit_may_have_committed = False

    @property
    def max_query_params(self) -> int:  # type: ignore[override]
        """SQLite's limit on a statement's parameters, read from the connection each time: 32,766 in
        the default build since 3.32, 999 before; builds differ (tests/test_enqueue.py
        test_enqueue_many_keeps_each_sqlite_statement_within_the_parameter_limit)."""
        self.conn.ensure_connection()
        try:
            import sqlite3

            limit = sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER  # type: ignore[attr-defined,unused-ignore]
            return self.conn.connection.getlimit(limit)  # Python 3.11+
        except AttributeError:
            return 999


class SQLiteBackend(BaseBackend):
    greatest = "MAX"
    least = "MIN"
    features_class = SQLiteFeatures

    def due_index_hint(self) -> str:
        # Planners that see "status = 'pending'" first may pick the claim index and read every
        # pending row; the due statements are only fast on the due index, which reads due rows.
        return f" INDEXED BY {DUE_INDEX}"

    def is_in_memory(self) -> bool:
        return bool(self.conn.is_in_memory_db())

    def holds_write_lock(self) -> bool:
        # Its transactions are IMMEDIATE (configure_sqlite): BEGIN takes the lock.
        return bool(self.conn.in_atomic_block)

    def queue_index_hint(self) -> str:
        return f" INDEXED BY {QUEUE_INDEX}"

    def running_index_hint(self) -> str:
        """The lease statements read the 'running' range of a status-led index. SQLite's
        statistics give only the average rows per status, so with a million pending rows it read
        the whole table for recovery's ORDER BY locked_until instead (tests/test_explain.py
        test_lease_statements_read_only_running_rows_with_a_million_future_rows)."""
        return f" INDEXED BY {DUE_INDEX}"

    def horizon(self) -> horizon.Horizon:
        """The size of the -wal file: a reader that stays open keeps every checkpoint from
        restarting it, and it grows with every write (tests/test_horizon.py)."""
        return horizon.sqlite(self.conn)

    def before_first_connection(self) -> None:
        """Django's JSONField check asks whether SQLite has JSON inside transaction.atomic(), on
        the connection it opens for the question: under the IMMEDIATE transactions
        configure_sqlite sets up, that BEGIN waited for any other writer, then answered "no"
        (fields.E180) once the busy timeout ended, and the process refused to start. The answer
        is the SQLite library's, the same for every file: asked of an in-memory database, which
        waits for nothing (tests/test_sqlite.py
        test_checks_pass_at_once_while_another_connection_holds_the_write_lock)."""
        conn = self.conn
        if sets_up_sqlite(conn) and "transaction_mode" not in conn.settings_dict.get("OPTIONS", {}):
            conn.features.__dict__.setdefault("supports_json_field", _has_json())

    def configure_session(self) -> None:
        if sets_up_sqlite(self.conn):
            configure_sqlite(self.conn)
        if getattr(self.conn, "rws_private", False):
            self.conn.connection.text_factory = read_text

    def begin_sql(self, write: bool) -> str:
        return "BEGIN IMMEDIATE" if write else "BEGIN"

    def write_lock(self) -> AbstractContextManager[Any]:
        """What the worker's own connections to one SQLite file hold around their writes.

        A connection that finds the file locked sleeps in SQLite's busy handler, 1 ms and more,
        however soon the writer is done: within a worker process the dispatcher's claim and the
        completer's delete would meet that way at nearly every claim. A lock of the process's own
        makes the second writer wait only as long as the first writes; other processes' writers
        still meet in the busy handler. Connections that are not the worker's own hold nothing.
        """
        conn = self.conn
        if not getattr(conn, "rws_private", False) or conn.is_in_memory_db():
            return nullcontext()
        name = str(conn.settings_dict["NAME"])
        with _write_locks_guard:
            return _write_locks.setdefault(name, threading.RLock())

    @contextmanager
    def time_limit(self, seconds: float) -> Iterator[None]:
        self.conn.ensure_connection()
        deadline = time.monotonic() + seconds
        # Called every PROGRESS_STEPS virtual machine steps; a true answer interrupts the statement.
        self.conn.connection.set_progress_handler(lambda: time.monotonic() > deadline, PROGRESS_STEPS)
        try:
            yield
        finally:
            self.conn.connection.set_progress_handler(None, 0)

    def is_time_limit_error(self, exc: BaseException) -> bool:
        return str(exc.__cause__) == "interrupted"

    def driver_cursor(self) -> DriverCursor:
        self.conn.cursor().close()  # connects (and configures the connection) as Django does
        # Django's SQLite cursor converts placeholders itself, again: the driver's cursor, with ours.
        return DriverCursor(self.conn.connection.cursor(), True, self.conn.wrap_database_errors)

    def check(self) -> list[Any]:
        import sqlite3

        from django.core.checks import Error

        if sqlite3.sqlite_version_info < (3, 35):
            return [
                Error(
                    f"SQLite {sqlite3.sqlite_version} is too old for django-rws-jobs; it needs 3.35 or "
                    "newer (UPDATE ... RETURNING)",
                    id="rws_jobs.E013",
                )
            ]
        return []


def read_text(data: bytes) -> str:
    """A TEXT value as str on the worker's own connections: bytes that are not UTF-8 (another
    program wrote them) come back as surrogate escapes instead of failing the statement, which
    would leave the other rows of the same claim taken and never run
    (tests/test_faults.py::test_a_row_that_is_not_utf8_does_not_strand_the_others_on_sqlite)."""
    return data.decode("utf-8", "surrogateescape")


def sets_up_sqlite(connection: BaseDatabaseWrapper) -> bool:
    """Whether ``connection`` gets the SQLite set-up: the worker's own connections, and Django's
    to the queue's alias or to one the project names in RWS_JOBS["SQLITE_SETUP_ALIASES"]. The
    project's other SQLite databases keep their own settings (tests/test_sqlite.py
    test_other_sqlite_aliases_keep_their_settings)."""
    if getattr(connection, "rws_private", False) or connection.alias == jobs_settings.DATABASE:
        return True
    extra = jobs_settings.SQLITE_SETUP_ALIASES
    return isinstance(extra, (list, tuple)) and connection.alias in extra


def _has_json() -> bool:
    probe = sqlite3.connect(":memory:")
    try:
        probe.execute("""SELECT JSON('{"a": "b"}')""")
    except sqlite3.OperationalError:
        return False
    finally:
        probe.close()
    return True


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
