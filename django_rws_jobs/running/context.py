"""What a running job knows about itself: ``current_job()``.

``attempts/run.py``'s ``execute`` sets a context variable to the job while its handler runs (the
thread pool, the process pool's child, ``tick()``, and ``django.tasks`` tasks, whose rows it
runs too); ``async def`` handlers see it because ``async_to_sync`` runs them in a copy of
the calling context. Outside a handler it is None. Invariant: a handler sees its own job, never
another's, whichever thread or process runs it (tests/test_current_job.py).

This module is imported with the package (``current_job`` and ``JobContext`` are public), before
Django's app registry is ready: the modules that load the models (reports.py, the database
part's backends, clock and connections, batches, outputs) are imported on call, each marked
"(loads the models)" (tests/test_imports.py
test_the_package_imports_before_the_app_registry_is_ready).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
from collections.abc import Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import connections

from ..conf import jobs_settings
from ..database.validation import json_without_nul, show, text
from ..database.validation import text as _text
from ..queue.metadata import metadata_text
from . import checkpoints
from .checkpoints import Checkpoint, stop_requested

if TYPE_CHECKING:
    from ..api.batches import Batch
    from ..database.backends.claimed import Claimed

#: The job whose handler runs in this context (the claim as the worker holds it).
running: ContextVar[Claimed | None] = ContextVar("rws_running_job", default=None)
#: The queue's database where jobs run (set once per executor thread, child process and tick());
#: unset, RWS_JOBS["DATABASE"].
serving: ContextVar[str | None] = ContextVar("rws_serving_alias", default=None)


#: Whether reports go through the calling thread's own connection: set by ``tick()`` when it
#: claims inside the caller's transaction, where no other connection sees the job's row (reports.py).
inline: ContextVar[bool] = ContextVar("rws_inline_reports", default=False)

T = TypeVar("T")
logger = logging.getLogger("django_rws_jobs")

#: The longest progress message, in characters.
MESSAGE_MAX = 1000
#: The largest magnitude of a progress number: every integer up to it is exact as a float.
PROGRESS_MAX = 2**53
NUMBERS = (int, float)


class JobContext:
    """The running job, as its handler sees it: one object per attempt."""

    __slots__ = (
        "_alias",
        "_batch_row",
        "_checkpoint",
        "_claim",
        "_inline",
        "_metadata",
        "_progress",
        "_queued",
        "_saved",
        "_stop",
        "_token",
        "_written",
        "attempt",
        "id",
        "job_type",
        "queue",
    )

    def __init__(self, claim: Claimed, alias: str, inline_writes: bool | None = False):
        #: The job's id.
        self.id: str = claim.id
        #: Its job type (a ``django.tasks`` task's is ``django.tasks:<module path>``).
        self.job_type: str = claim.job_type
        #: Its queue.
        self.queue: str = claim.queue
        #: Which run this is: 1 on the first, 2 on the first retry, and so on.
        self.attempt: int = claim.attempts + 1
        self._claim = claim  # its token fences what the handler writes
        self._token = claim.token
        self._alias = alias
        # Whether reports go through the handler's own connection (see reports.py); None: not
        # known yet, found at the first report (an in-memory SQLite database: True).
        self._inline = inline_writes
        self._batch_row: tuple[str | None, str | None] | None = None
        self._metadata: dict[str, Any] | None = None  # loaded at the first use
        self._saved: str | None = None  # the metadata's JSON as loaded or last saved
        self._progress: tuple[Any, Any, Any] | None = None  # the latest report
        self._queued = False  # the report waits in the writer (reports.Writer)
        self._written: tuple[Any, Any, Any] | None = None  # the report the writer last wrote
        self._checkpoint: Checkpoint | None = None  # loaded at the first use (checkpoints.py)
        self._stop = stop_requested.get()  # the worker's stop, which ``stopping`` reports

    def __repr__(self) -> str:
        return (
            f"JobContext(id={self.id!r}, job_type={self.job_type!r}, queue={self.queue!r}, "
            f"attempt={self.attempt})"
        )

    @property
    def batch_id(self) -> str | None:
        """The id of the batch this job is a member of, or whose callback it is; else None
        (read from the job's row when asked: the claim does not carry it)."""
        return self._batch()[0]

    @property
    def batch(self) -> Batch | None:
        """The batch (read now) this job is a member of, or whose callback it is; else None."""
        batch_id = self.batch_id
        if batch_id is None:
            return None
        from ..api.batches import get_batch  # (loads the models)

        return self._off_the_loop("batch", lambda: get_batch(batch_id, using=self._alias))

    @property
    def batch_event(self) -> str | None:
        """For a batch's callback, why it runs: "success", "failure" or "finish"; else None."""
        return self._batch()[1]

    def _batch(self) -> tuple[str | None, str | None]:
        if self._batch_row is None:
            row = self._off_the_loop("batch_id", self._read_batch)
            self._batch_row = (None, None) if row is None else (row[0], row[1])
        return self._batch_row

    def _off_the_loop(self, what: str, work: Callable[[], T], twin: str | None = None) -> T:
        """``work()``, database work: in this thread, or, where an ``async def`` handler's event
        loop runs here (Django refuses queries there), in a thread of its own whose connection is
        closed after (tests/test_reports.py::test_an_async_handler_reports_and_saves,
        tests/test_batches.py::test_an_async_handler_uses_every_job_context_method). A job that
        ``tick()`` claimed inside the caller's transaction is seen by no connection but the
        handler thread's: there a clear error, naming the async twin if there is one."""
        if not _on_the_loop():
            return work()
        if self._inline or (self._inline is None and _in_memory(self._alias)):
            raise self._seen_by_its_thread_only(what, twin)
        return _in_a_thread(work)

    def _seen_by_its_thread_only(self, what: str, twin: str | None) -> RuntimeError:
        instead = f"{twin}, or " if twin else ""
        return RuntimeError(
            f"current_job().{what} on the event loop of an async def handler whose job tick() "
            "claimed inside a transaction (or on an in-memory SQLite database): no connection but "
            f"the handler thread's sees the job's row; use {instead}a test outside a transaction "
            "(django_db(transaction=True), TransactionTestCase)"
        )

    def _preload(self) -> None:
        """Read the metadata and the batch's id and event now, in the handler's thread."""
        self._batch()
        _ = self.metadata

    def _read_batch(self) -> tuple[str | None, str | None] | None:
        from ..models import Job  # (loads the models)

        return (
            Job.objects.using(self._alias).filter(id=self.id).values_list("batch_id", "batch_event").first()
        )

    @property
    def metadata(self) -> dict[str, Any]:
        """The job's metadata (``enqueue(metadata=)``, or what an earlier attempt saved), a dict
        the handler may change: ``save_metadata()`` writes it, and so does the end of the attempt
        if it changed (tests/test_reports.py)."""
        if self._metadata is None:
            text = self._off_the_loop("metadata", self._read_metadata)
            if text is not None and not isinstance(text, str):  # a driver that decodes JSON
                text = json.dumps(text, ensure_ascii=False, separators=(",", ":"))
            loaded = json.loads(text) if text else None
            self._metadata = loaded if isinstance(loaded, dict) else {}
            # As this class writes it (PostgreSQL's jsonb gives its own spacing): unchanged
            # metadata is not saved again at the attempt's end.
            self._saved = _dumps(self._metadata) if text else None
        return self._metadata

    def _read_metadata(self) -> Any:
        with connections[self._alias].cursor() as c:
            c.execute("SELECT metadata FROM rws_jobs WHERE id = %s", [self.id])
            row = c.fetchone()
        return None if row is None else row[0]

    def progress(self, current: float, total: float | None = None, message: str | None = None) -> None:
        """Report how far the job is: ``current`` of ``total`` (numbers; total may be None),
        with an optional ``message``. Cheap: the latest report is written at most once a second,
        by the worker's own connection, so it is seen at once even inside the handler's
        transaction; ``django_rws_jobs.get_progress(job_id)`` reads it."""
        # False for inf and nan, and for a number past PROGRESS_MAX (an int of any size is
        # accepted by JSON, then get_progress().fraction and the admin raise OverflowError:
        # tests/test_reports.py::test_bad_progress_is_a_clear_error).
        if not (type(current) in NUMBERS and -PROGRESS_MAX <= current <= PROGRESS_MAX) or (
            total is not None and not (type(total) in NUMBERS and -PROGRESS_MAX <= total <= PROGRESS_MAX)
        ):
            _check_number("current", current)
            _check_number("total", total)
        if message is not None:
            _check_message(message)
        self._progress = (current, total, message)
        if self._inline is None:
            self._inline = _in_memory(self._alias)
        if self._inline:
            if _on_the_loop():
                # Only the handler's thread can write through its connection: the report is
                # written by the next asave_metadata() or by a failed attempt's end (tests/
                # test_batches.py::test_an_async_handler_ticked_inside_a_transaction_names_the_twins).
                return
            self._write_inline()
        elif not self._queued:
            self._queued = True
            from .reports import writer  # (loads the models)

            writer(self._alias).queue(self)

    def _write_inline(self) -> None:
        from .reports import direct, write_job  # (loads the models)

        write_job(lambda sql, params: direct(self._alias, sql, params), self, _now(self._alias))

    def save_metadata(self) -> bool:
        """Write ``metadata`` now, with the latest progress, outside the handler's transaction,
        and wait for the write. True if written; False if this attempt no longer holds its claim
        (its lease was taken over) or the write failed. TypeError or ValueError, writing nothing,
        for metadata that is not JSON or is over METADATA_MAX_BYTES."""

        text = metadata_text(self.metadata)
        applied, in_transaction = self._write_now(text, metadata=True, what="save_metadata()")
        if applied and not in_transaction:  # (a rolled back save is made again at the attempt's end)
            self._saved = text
        return applied

    def _write_now(self, text: str | None, metadata: bool, what: str) -> tuple[bool, bool]:
        """Write the metadata ``text`` (with ``metadata``), the latest progress and the changed
        checkpoint now and wait: (whether the claim held, whether the write went through the
        handler's own open transaction)."""
        if self._inline is None:
            self._inline = _in_memory(self._alias)
        in_transaction = not self._inline and _holds_sqlite_write_lock(self._alias)
        if self._inline or in_transaction:
            if _on_the_loop():
                raise self._seen_by_its_thread_only(what, "await asave_metadata()" if metadata else None)
            from .reports import direct, write_job  # (loads the models)

            run = lambda sql, params: direct(self._alias, sql, params)  # noqa: E731
            return write_job(run, self, _now(self._alias), text, metadata), in_transaction
        from .reports import writer  # (loads the models)

        return writer(self._alias).save(self, text, metadata=metadata), False

    async def asave_metadata(self) -> bool:
        """``save_metadata()`` for an ``async def`` handler: the wait runs in the handler's thread
        (``sync_to_async``), not on its event loop (``save_metadata()`` called there waits on the
        loop)."""

        return bool(await sync_to_async(self.save_metadata)())

    def _end(self, failed: bool = False) -> None:
        """The attempt is over: save its metadata if the handler changed it; write its unwritten
        progress and checkpoint if it ``failed`` or was handed back (the row stays: it shows where
        the attempt stopped, and the next attempt resumes there), else drop them. TypeError or
        ValueError for changed metadata that cannot be saved (the attempt fails with it). A stop
        that lands in a success's save (a JobTimeout, a JobCancelled) ends it again as failed,
        writing only what is not written yet, and goes on
        (tests/test_reports.py::test_a_stopped_attempt_keeps_its_metadata_and_last_progress)."""
        try:
            changed = False
            if self._metadata is not None:
                text = metadata_text(self._metadata)
                changed = text != self._saved and not (text == "{}" and self._saved is None)
            if self._queued:
                from .reports import writer  # (loads the models)

                writer(self._alias).forget(self)
            unwritten = self._progress is not self._written or (
                self._checkpoint is not None and self._checkpoint.writable()
            )
            if changed:
                self.save_metadata()  # and the latest progress, and the checkpoint
            elif failed and unwritten and self._inline:
                self._write_inline()  # a report an async def handler made on its event loop
            elif failed and unwritten:
                # Not known to be written: it was queued, or the writer took it and may be writing
                # it now (the save waits for that round). The failure is recorded after this
                # write, so the fence still holds (tests/test_reports.py
                # test_a_failed_attempts_last_progress_stays_when_the_writer_takes_it_at_the_end).
                from .reports import writer  # (loads the models)

                writer(self._alias).save(self, None, metadata=False)
        except Exception:
            raise
        except BaseException:
            if not failed:
                self._end(failed=True)
            raise

    # -- long jobs (checkpoints.py) ---------------------------------------------------------------

    def iterate(self, items: Any, *, by: str = "pk", name: str | None = None) -> Any:
        """The items of ``items`` after this job's saved cursor, for a ``for`` loop: ``items`` is
        a QuerySet ordered by ``by`` (a unique field, the primary key by default), read a page at
        a time, or a function ``items(cursor)`` that yields (cursor, item) pairs from ``cursor``
        (None the first time). An item's cursor is saved once the loop's body for it has
        returned; when the worker is asked to stop, the loop raises JobInterrupted at the next
        item and the job is handed back, its attempt not charged, to resume there. A QuerySet's
        loop reports progress (done of its count). ``name`` keys the loop's cursor (by default
        its order among this attempt's loops: "iterate-1", ...). Pinned by tests/test_long_jobs.py."""
        return checkpoints.iterate(self, items, by, name)

    def step(self, name: str, fn: Callable[..., Any], *args: Any, atomic: bool = False, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` run at most once to success for this job: its result (JSON, at
        most OUTPUT_MAX_BYTES) is saved before it is returned, and a later attempt returns the
        saved result without calling ``fn``. ``atomic=True``: ``fn`` runs in a transaction on the
        queue's database that also saves the result, fenced by the claim, so its writes to that
        database commit exactly once. Steps are matched by ``name``; two in one attempt is an
        error. The result returned is the saved JSON's value (a tuple comes back a list)."""
        return checkpoints.step(self, name, fn, args, kwargs, atomic)

    @property
    def stopping(self) -> bool:
        """True once the worker running this job was asked to stop (SIGTERM, SIGINT): a handler
        that loops on its own saves what it needs and raises JobInterrupted to be handed back."""
        stop = self._stop
        return stop is not None and stop.is_set()

    @property
    def checkpoint(self) -> dict[str, Any]:
        """What is saved for this job, a copy: {"steps": {name: result}, "cursors": {loop:
        cursor}, "finished": [loop, ...]}."""
        return self._loaded_checkpoint().view()

    def _loaded_checkpoint(self) -> Checkpoint:
        if self._checkpoint is None:
            saved = self._off_the_loop("checkpoint", self._read_checkpoint)
            self._checkpoint = Checkpoint(saved, self.id)
        return self._checkpoint

    def _read_checkpoint(self) -> Any:
        with connections[self._alias].cursor() as c:
            c.execute("SELECT checkpoint FROM rws_jobs WHERE id = %s", [self.id])
            row = c.fetchone()
        return None if row is None else row[0]

    def _report_soon(self) -> None:
        """Have the progress and changed checkpoint written at the writer's next round (or now,
        through the handler's connection, where only it sees the row)."""
        if self._inline_writes():
            if not _on_the_loop():
                self._write_inline()
        elif not self._queued:
            self._queued = True
            from .reports import writer  # (loads the models)

            writer(self._alias).queue(self)

    def _save_checkpoint(self, what: str) -> None:
        """Write the changed checkpoint now and wait (a step's result)."""
        applied, _ = self._write_now(None, metadata=False, what=what)
        if not applied:
            logger.warning(
                "job %s: %s's result was not saved (this attempt no longer holds its claim, or the "
                "write failed): a later attempt runs it again",
                self.id,
                what,
            )

    def _inline_writes(self) -> bool:
        if self._inline is None:
            self._inline = _in_memory(self._alias)
        return bool(self._inline)

    @staticmethod
    def _on_loop() -> bool:
        return _on_the_loop()

    def record(self, value: Any) -> bool:
        """Keep ``value`` (JSON, at most OUTPUT_MAX_BYTES of it) as this batch member's output,
        which ``Batch.outputs()`` reads; a later call, or a later attempt's, replaces it. Written
        through the handler's connection, so inside its ``transaction.atomic()`` it commits or
        rolls back with the handler's work. Returns False, keeping nothing, for a job that is not
        a batch member (a callback is not one) or whose claim this attempt no longer holds
        (tests/test_batches.py::test_record_keeps_a_members_last_output)."""
        text = output_text(value)
        from ..workflows.outputs import keep  # (loads the models)

        return self._off_the_loop("record()", lambda: keep(self._alias, self._claim, text), "await arecord()")

    async def arecord(self, value: Any) -> bool:
        """``record()`` for an ``async def`` handler: written in the handler's thread
        (``sync_to_async``), through the connection its ``sync_to_async`` database calls use
        (``record()`` called on the event loop writes through a connection of its own)."""

        return bool(await sync_to_async(self.record)(value))


def _on_the_loop() -> bool:
    """Whether an event loop (an ``async def`` handler's) runs in this thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _in_a_thread(read: Callable[[], T]) -> T:
    """``read()`` in a thread of its own whose connection is closed after, waited for."""
    done: list[Any] = []

    def run() -> None:
        try:
            done.append((True, read()))
        except BaseException as exc:  # noqa: BLE001  (raised again in the caller's thread)
            done.append((False, exc))
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, name="rws-metadata-read")
    thread.start()
    thread.join()
    ok, value = done[0]
    if not ok:
        raise value
    return value


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _check_number(name: str, value: Any) -> None:
    if value is None and name == "total":
        return

    if type(value) is bool or not isinstance(value, (int, float)):
        raise TypeError(f"progress(): {name} must be a number, got {type(value).__name__} {show(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"progress(): {name} must be a finite number, got {value!r}")
    if not -PROGRESS_MAX <= value <= PROGRESS_MAX:
        raise ValueError(
            f"progress(): {name} {show(value)} is out of range; "
            f"it must be between {-PROGRESS_MAX} and {PROGRESS_MAX}"
        )


def _check_message(message: Any) -> None:

    text("progress()'s message", message, limit=MESSAGE_MAX, empty=True)


def _in_memory(alias: str) -> bool:
    """An in-memory SQLite database: no other connection sees it."""
    from ..database.backends import backend_for  # (loads the models)

    return backend_for(connections[alias]).is_in_memory()


def _holds_sqlite_write_lock(alias: str) -> bool:
    """Whether the calling thread's transaction holds the queue's SQLite file's one write lock (its
    transactions are IMMEDIATE): another connection's write would wait for it, so a save made now
    goes through this transaction and is seen when it commits
    (tests/test_reports.py::test_on_sqlite_a_save_inside_a_transaction_is_written_with_it)."""
    from ..database.backends import backend_for  # (loads the models)

    return backend_for(connections[alias]).holds_write_lock()


def _now(alias: str) -> float:
    from ..database import clock  # (loads the models)

    return clock.now(alias)


def output_text(value: Any) -> str:
    """``value`` as the JSON text ``record`` keeps, within OUTPUT_MAX_BYTES."""

    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"record() takes a JSON value, got {show(value)}: {exc}") from None
    size, limit = len(text.encode("utf-8", "surrogatepass")), int(jobs_settings.OUTPUT_MAX_BYTES)
    if size > limit:
        raise ValueError(
            f"record(): the value is {size} bytes of JSON; the limit is {limit} (OUTPUT_MAX_BYTES)"
        )
    json_without_nul("record()'s value", value, text)
    return _text("record()'s value", text)


def _alias() -> Any:
    alias = serving.get()
    if alias is not None:
        return alias
    from ..database.connections import queue_alias  # (loads the models)

    return queue_alias(None)


def current_job() -> JobContext | None:
    """The job whose handler is running in this thread or task, or None outside a handler."""
    job = running.get()
    if job is None:
        return None
    context = job.context
    if context is None:
        context = job.context = context_of(job)
    return context


def context_of(job: Claimed) -> JobContext:
    """A new JobContext for the attempt that holds ``job``."""
    return JobContext(job, _alias(), inline.get() or None)
