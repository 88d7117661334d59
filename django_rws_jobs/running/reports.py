"""What a running job tells while it runs: its progress and its saved metadata.

A handler's ``current_job().progress(...)`` and ``save_metadata()`` are written by one thread per
process and database, on a connection of its own (``Writer``), never through the handler's:

- Visible at once to other processes, even while the handler's own transaction is open, and kept
  whether that transaction commits or rolls back
  (tests/test_reports.py::test_progress_is_seen_while_the_handler_holds_a_transaction).
- Fenced by the claim: each write applies only while the job's ``locked_by`` is the attempt's
  token, so an attempt whose lease was taken over cannot overwrite the next one's
  (test_a_lost_claim_writes_nothing).
- Coalesced: progress is written at most once every ``INTERVAL`` seconds, the latest value of each
  job, however often a handler reports it (test_progress_in_a_tight_loop_costs_a_few_writes).
  ``save_metadata()`` is written at once and waits for its write.
- A long job's checkpoint (checkpoints.py) rides in the same UPDATE as its progress, when it
  changed: a loop's cursors cost no write of their own.

A job claimed inside a transaction of the caller's (``tick()`` in an ``atomic()`` block or a
TestCase), or on an in-memory SQLite database, has its writes made through the caller's own
connection instead: another connection could not see its row.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from django.db import DatabaseError, connections

from ..database import clock
from ..database.connections import private_connection, queue_alias, write_lock
from ..database.deadline import watch
from ..database.validation import job_id as _job_id
from ..queue.progress import Progress, parse_progress

if TYPE_CHECKING:
    from .checkpoints import Checkpoint

logger = logging.getLogger("django_rws_jobs")

#: Seconds between two writes of progress (the latest value of each job that reported one).
INTERVAL = 1.0
#: Seconds without anything to write after which the writer closes its connection.
IDLE_CLOSE = 5.0
#: Seconds ``save_metadata()`` waits for its write at most.
SAVE_WAIT = 60.0


def progress_text(report: tuple[Any, Any, Any]) -> str:
    current, total, message = report
    return json.dumps({"current": current, "total": total, "message": message}, ensure_ascii=False)


def get_progress(job_id: Any, *, using: str | None = None) -> Progress | None:
    """The job's last written progress, or None."""

    alias = queue_alias(using)
    job_id = _job_id(job_id)
    with connections[alias].cursor() as c:
        c.execute("SELECT progress, progress_at FROM rws_jobs WHERE id = %s", [job_id])
        row = c.fetchone()
    if row is None or row[0] is None:
        return None
    return parse_progress(row[0], row[1])


class Reporting(Protocol):
    """What the writer reads and writes of a running job's context (context.JobContext)."""

    id: str
    _token: str
    _progress: tuple[Any, Any, Any] | None  # the latest report
    _queued: bool  # the report waits in the writer
    _written: tuple[Any, Any, Any] | None  # the report the writer last wrote
    _checkpoint: Checkpoint | None  # its steps' results and loops' cursors, once used


def write_job(
    execute: Callable[[str, list[Any]], bool],
    job: Reporting,
    at: float,
    text: str | None = None,
    metadata: bool = False,
) -> bool:
    """One UPDATE, fenced on the claim, of what ``job`` has to write: its latest progress, its
    metadata ``text`` (with ``metadata``), its checkpoint if it changed and may be written
    (checkpoints.Checkpoint.writable, read and written under its lock). Whether the claim held;
    True when there was nothing to write."""
    report = job._progress
    sets: list[str] = []
    params: list[Any] = []
    if report is not None:
        sets.append("progress = %s, progress_at = %s")
        params += [progress_text(report), at]
    if metadata:
        sets.append("metadata = %s")
        params.append(text)
    ck = job._checkpoint
    with ck.lock if ck is not None else nullcontext():
        with_checkpoint = ck is not None and ck.writable()
        if with_checkpoint:
            assert ck is not None
            ck.dirty = False  # before the snapshot: a cursor moved after it marks it again
            sets.append("checkpoint = %s")
            params.append(ck.text())
        if not sets:
            return True
        applied = execute(
            f"UPDATE rws_jobs SET {', '.join(sets)} WHERE id = %s AND locked_by = %s",
            [*params, job.id, job._token],
        )
        if with_checkpoint and not applied:
            assert ck is not None
            ck.dirty = True
    if applied and report is not None:
        job._written = report
    return applied


@dataclass
class Save:
    """A ``save_metadata()`` waiting for its write; with ``metadata`` False, a write of the latest
    progress and checkpoint alone (a failed attempt's, at its end; a step's result)."""

    job: Reporting
    text: str | None
    metadata: bool = True
    done: threading.Event = field(default_factory=threading.Event)
    applied: bool = False


class Writer:
    """The reports of one database's running jobs in this process, and the thread that writes
    them (started at the first report)."""

    def __init__(self, alias: str):
        self.alias = alias
        self.lock = threading.Lock()
        self.queued: dict[int, Reporting] = {}  # id(job): a job with a progress to write
        self.saves: list[Save] = []
        self.wake = threading.Event()  # something to write
        self.urgent = threading.Event()  # a save waits: write now
        self.thread: threading.Thread | None = None
        self.conn: Any = None
        self.deadline = watch()  # the statement deadline of the writer's connection
        self.last_write = 0.0

    def queue(self, job: Reporting) -> None:
        """Write ``job``'s progress at the next round (``job._queued`` is set by the caller)."""
        with self.lock:
            self.queued[id(job)] = job
            self._start()
        self.wake.set()

    def forget(self, job: Reporting) -> None:
        """Drop ``job``'s unwritten progress: its attempt has ended."""
        with self.lock:
            self.queued.pop(id(job), None)
        job._queued = False

    def save(self, job: Reporting, text: str | None, metadata: bool = True) -> bool:
        """Write ``job``'s metadata (``text``), its latest progress and its changed checkpoint now,
        or with ``metadata`` False its progress and checkpoint alone; whether its claim held."""
        request = Save(job, text, metadata)
        with self.lock:
            self.saves.append(request)
            self._start()
        self.urgent.set()
        self.wake.set()
        if not request.done.wait(SAVE_WAIT):
            logger.warning("job %s: save_metadata() not written within %.0f s", job.id, SAVE_WAIT)
            return False
        return request.applied

    def _start(self) -> None:
        if self.thread is None or not self.thread.is_alive():
            self.thread = threading.Thread(target=self._run, name="rws-reports", daemon=True)
            self.thread.start()

    def _run(self) -> None:
        while True:
            if not self.wake.wait(IDLE_CLOSE):
                self._close()
                connections.close_all()  # this thread's own, if clock.now() opened one
                continue
            rest = self.last_write + INTERVAL - time.monotonic()
            if rest > 0:
                self.urgent.wait(rest)
            self.wake.clear()
            self.urgent.clear()
            with self.lock:
                queued, self.queued = self.queued, {}
                saves, self.saves = self.saves, []
                for job in queued.values():
                    job._queued = False  # a report after this is queued again
            if queued:
                self.last_write = time.monotonic()
            try:
                self._write(list(queued.values()), saves)
            except Exception:
                logger.exception("writing running jobs' progress")
                self._close()
            finally:
                for request in saves:
                    request.done.set()

    def _write(self, jobs: list[Reporting], saves: list[Save]) -> None:
        at = clock.now(self.alias)
        saved = {id(s.job) for s in saves}
        for request in saves:
            request.applied = write_job(self._execute, request.job, at, request.text, request.metadata)
        for job in jobs:
            if id(job) not in saved:
                write_job(self._execute, job, at)

    def _execute(self, sql: str, params: list[Any]) -> bool:
        if self.conn is None:
            self.conn = private_connection(self.alias)
        conn = self.conn
        try:
            deadline = self.deadline
            deadline.start(conn, "writing a running job's progress")
            try:
                with write_lock(conn), conn.cursor() as c:
                    c.execute(sql, params)
                    return bool(c.rowcount == 1)
            finally:
                deadline.done()
        except DatabaseError as exc:
            logger.warning("could not write job %s's progress or metadata: %s", params[-2], exc)
            self._close()
            return False

    def _close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            try:
                conn.close()
            except DatabaseError:
                pass


def direct(alias: str, sql: str, params: list[Any]) -> bool:
    """A write through the calling thread's own connection (a claim inside the caller's
    transaction: see the module's docstring)."""
    with connections[alias].cursor() as c:
        c.execute(sql, params)
        return bool(c.rowcount == 1)


_writers: dict[str, Writer] = {}
_writers_lock = threading.Lock()


def writer(alias: str) -> Writer:
    """This process's writer for ``alias``."""
    found = _writers.get(alias)
    if found is None:
        with _writers_lock:
            found = _writers.setdefault(alias, Writer(alias))
    return found


def _forget_in_child() -> None:
    """A forked child (the process pool's) starts with no writer: the parent's thread and
    connection are not its own."""
    _writers.clear()


os.register_at_fork(after_in_child=_forget_in_child)
