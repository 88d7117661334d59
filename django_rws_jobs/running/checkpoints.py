"""A long job's saved state: its steps' results and its loops' cursors (``current_job().step``,
``iterate``, ``checkpoint``), and the stop it watches for (``stopping``).

The state is one JSON text in ``rws_jobs.checkpoint``, ``{"steps": {name: result}, "cursors":
{loop: cursor}, "finished": [loop, ...]}``, read at the first use in an attempt and written only
by the claim's holder (fenced on ``locked_by``). Invariants, each pinned by tests/test_long_jobs.py:

- A loop's cursor moves once the caller's loop body for its item has returned, never before: a
  resumed loop starts after the last finished item (no item skipped; after a ``kill -9`` the
  items since the last write run again, at least once).
- Cursors are written by the process's report writer (reports.py) with the progress it writes
  anyway, at least every CHECKPOINT_INTERVAL seconds, and at the attempt's end when it failed or
  was handed back (context.JobContext._end).
- A step's result is written before ``step`` returns: a completed step is never run again for
  the job. ``atomic=True`` writes it in the transaction of the step's own writes, fenced by the
  claim: both commit, or neither.
- No write of the writer carries a state older than a committed atomic step: while one runs, the
  writer leaves the job's checkpoint alone (``Checkpoint.stepping``), and after a commit whose
  outcome is unknown (a cut connection) this attempt writes no more of it (``frozen``).
"""

from __future__ import annotations

import inspect
import json
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from datetime import date, datetime
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction
from django.db.models import QuerySet

from ..conf import jobs_settings
from ..database.validation import show
from ..database.validation import text as _text
from ..exceptions import JobInterrupted

if TYPE_CHECKING:
    from .context import JobContext


class StopFlag:
    """Set once the worker is asked to stop (SIGTERM, SIGINT, its parent gone); a plain attribute,
    no lock: a signal handler may set it while the thread it interrupted reads it."""

    __slots__ = ("raised",)

    def __init__(self) -> None:
        self.raised = False

    def set(self) -> None:
        self.raised = True

    def is_set(self) -> bool:
        return self.raised


#: The stop the running job watches for: the worker's (set per executor thread and in the process
#: pool's child); None where nothing asks a job to stop (tick()).
stop_requested: ContextVar[StopFlag | None] = ContextVar("rws_stop_requested", default=None)

#: Rows ``iterate`` reads from a QuerySet per query (keyset pages: no cursor or snapshot held
#: open between them).
PAGE = 500
#: The longest name of a step or a loop, in characters.
NAME_MAX = 191

CHECKPOINT_SQL = "UPDATE rws_jobs SET checkpoint = %s WHERE id = %s AND locked_by = %s"


class ClaimLost(RuntimeError):
    """An atomic step's write found that this attempt no longer holds its job's claim: its
    transaction is rolled back."""


class Checkpoint:
    """One attempt's view of its job's saved state. ``lock`` guards the structure (a new loop, a
    step's result) against the report writer's snapshot, which it holds while it writes."""

    __slots__ = ("cursors", "dirty", "due", "finished", "frozen", "lock", "loops", "ran", "stepping", "steps")

    def __init__(self, saved: Any, job_id: str):
        state = _parse(saved, job_id)
        self.steps: dict[str, Any] = state["steps"]
        self.cursors: dict[str, Any] = state["cursors"]
        self.finished: list[str] = state["finished"]
        self.lock = threading.Lock()
        self.dirty = False  # changed since the last write
        self.stepping = False  # an atomic step's transaction is open
        self.frozen = False  # an atomic step's commit may or may not have happened
        self.due = 0.0  # time.monotonic() when the cursors are written next (a callable's loop)
        self.ran: set[str] = set()  # the steps this attempt called
        self.loops: list[str] = []  # the loops this attempt started

    def text(self, step: tuple[str, Any] | None = None) -> str:
        """The state as JSON (with ``step``'s result added); call with ``lock`` held."""
        steps = self.steps if step is None else {**self.steps, step[0]: step[1]}
        return _dumps({"steps": steps, "cursors": self.cursors, "finished": self.finished})

    def writable(self) -> bool:
        return self.dirty and not self.stepping and not self.frozen

    def view(self) -> dict[str, Any]:
        with self.lock:
            value: dict[str, Any] = json.loads(self.text())
        return value


def _parse(saved: Any, job_id: str) -> dict[str, Any]:
    empty: dict[str, Any] = {"steps": {}, "cursors": {}, "finished": []}
    if saved is None or saved == "":
        return empty
    try:
        state = json.loads(saved) if isinstance(saved, str) else saved
    except ValueError as exc:
        raise ValueError(
            f"job {job_id}'s checkpoint is not JSON ({exc}): restart it from the beginning"
        ) from None
    if not (
        isinstance(state, dict)
        and isinstance(state.get("steps", {}), dict)
        and isinstance(state.get("cursors", {}), dict)
        and isinstance(state.get("finished", []), list)
    ):
        raise ValueError(
            f"job {job_id}'s checkpoint {show(saved)} is not a checkpoint (an object of steps, "
            "cursors and finished loops): restart it from the beginning"
        )
    return {**empty, **state}


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def name_of(what: str, value: Any) -> str:
    return _text(f"{what}'s name", value, limit=NAME_MAX)


# -- iterate ---------------------------------------------------------------------------------------


def iterate(context: JobContext, items: Any, by: str, name: str | None) -> Iterator[Any]:
    """``current_job().iterate``: checked now, run as the caller iterates."""
    if not isinstance(by, str) or not by:
        raise TypeError(f"iterate(): by must be a field name, got {show(by)}")
    ck = context._loaded_checkpoint()
    key = name_of("iterate()", name) if name is not None else f"iterate-{len(ck.loops) + 1}"
    if key in ck.loops:
        raise ValueError(f"iterate(): two loops named {key!r} in one attempt; give each a name of its own")
    if isinstance(items, QuerySet):
        pages = _pages(items, by)
        loop: Iterator[Any] = _rows(context, ck, key, items, pages, by)
    elif callable(items):
        loop = _produced(context, ck, key, items)
    else:
        raise TypeError(
            f"iterate() takes a QuerySet or a function items(cursor) -> (cursor, item) pairs, "
            f"got {type(items).__name__} {show(items)}"
        )
    with ck.lock:
        ck.loops.append(key)
        if key in ck.finished:
            return iter(())
        # The loop's key is in place before its first item: an item's cursor then replaces a
        # value, which the writer's snapshot (taken under the lock) may meet; adding a key
        # while it reads the dict would break its read.
        ck.cursors.setdefault(key, None)
    return loop


def _pages(items: QuerySet[Any], by: str) -> QuerySet[Any]:
    """``items`` ordered by ``by`` for keyset pages, or a clear error: sliced, ordered otherwise,
    or ``by`` not a unique field of its model (ties would be skipped at a page's edge)."""
    if items.query.is_sliced:
        raise ValueError("iterate(): the QuerySet is sliced; filter it instead (its pages are read by `by`)")
    meta = items.model._meta
    field = meta.pk if by == "pk" else None
    if field is None:
        try:
            field = meta.get_field(by)
        except Exception:
            raise ValueError(f"iterate(): by={by!r} is not a field of {meta.label}") from None
    if not (field.primary_key or getattr(field, "unique", False)):
        raise ValueError(
            f"iterate(): by={by!r} is not a unique field of {meta.label}: items sharing a value could be "
            "skipped at a page's edge; use a unique field (the primary key by default)"
        )
    names = {by, field.name, getattr(field, "attname", field.name)} | ({"pk"} if field.primary_key else set())
    ordering = list(items.query.order_by) or (list(meta.ordering) if items.query.default_ordering else [])
    if ordering and not (len(ordering) == 1 and isinstance(ordering[0], str) and ordering[0] in names):
        raise ValueError(
            f"iterate(): the QuerySet is ordered by {ordering!r}, not by {by!r} ascending; order it by "
            f"{by!r} (its contract: the cursor is the last finished item's {by})"
        )
    return items.order_by(by)


def _rows(
    context: JobContext, ck: Checkpoint, key: str, items: QuerySet[Any], pages: QuerySet[Any], by: str
) -> Iterator[Any]:
    """A QuerySet's items after the saved cursor, a page at a time; its progress reported."""
    cursor = ck.cursors.get(key)
    total = items.count()
    done = 0 if cursor is None else pages.filter(**{f"{by}__lte": cursor}).count()
    field = items.model._meta.pk.attname if by == "pk" else by
    stop = context._stop
    stored: Callable[[Any], Any] | None = None
    _interrupt_if_stopping(context, stop)
    while True:
        page = pages if cursor is None else pages.filter(**{f"{by}__gt": cursor})
        rows = list(page[:PAGE])
        for row in rows:
            yield row
            # The body for ``row`` has returned: its cursor is saved (sidekiq#6405's off-by-one).
            value = row[field] if isinstance(row, dict) else getattr(row, by)
            if stored is None:
                stored = _storage_for(value, by)
            cursor = stored(value)
            ck.cursors[key] = cursor
            ck.dirty = True
            done += 1
            context._progress = (done, total, None)
            if not context._queued:
                context._report_soon()
            if stop is not None and stop.is_set():
                _interrupt(context, key, cursor)
        if len(rows) < PAGE:
            break
    _finish(context, ck, key)


def _storage_for(value: Any, by: str) -> Callable[[Any], Any]:
    """How a QuerySet item's ``by`` value is saved as JSON, decided by its first item."""
    if type(value) is int or type(value) is str:
        return _same
    if isinstance(value, (uuid.UUID, datetime, date)):
        return _as_text
    if isinstance(value, float) and math.isfinite(value):
        return _same
    raise TypeError(
        f"iterate(): the items' {by} {show(value)} ({type(value).__name__}) cannot be saved as a "
        "JSON cursor; iterate by a field of int, str, UUID, date or datetime values"
    )


def _same(value: Any) -> Any:
    return value


def _as_text(value: Any) -> str:
    return value.isoformat() if isinstance(value, (datetime, date)) else str(value)


def _produced(context: JobContext, ck: Checkpoint, key: str, items: Callable[[Any], Any]) -> Iterator[Any]:
    """What ``items(cursor)`` yields, as (cursor, item) pairs, after the saved cursor."""
    stop = context._stop
    interval = float(jobs_settings.CHECKPOINT_INTERVAL)
    _interrupt_if_stopping(context, stop)
    source = items(ck.cursors.get(key))
    if inspect.isawaitable(source) or inspect.isasyncgen(source):
        raise TypeError("iterate(): items(cursor) must return a plain iterable, not an awaitable")
    for pair in source:
        try:
            cursor, item = pair
        except (TypeError, ValueError):
            raise TypeError(
                f"iterate(): items(cursor) must yield (cursor, item) pairs, got {type(pair).__name__} "
                f"{show(pair)}"
            ) from None
        cursor = _checked_cursor(cursor)
        yield item
        ck.cursors[key] = cursor
        ck.dirty = True
        now = time.monotonic()
        if now >= ck.due:
            ck.due = now + interval
            context._report_soon()
        if stop is not None and stop.is_set():
            _interrupt(context, key, cursor)
    _finish(context, ck, key)


def _checked_cursor(cursor: Any) -> Any:
    """``cursor`` if JSON can hold it (a private copy of a container), else a clear error."""
    kind = type(cursor)
    if kind is int or kind is str:
        return cursor
    if cursor is None:
        raise TypeError("iterate(): a cursor must not be None (None stands for the start)")
    try:
        return json.loads(_dumps(cursor))
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"iterate(): a cursor must be a JSON value, got {type(cursor).__name__} {show(cursor)}: {exc}"
        ) from None


def _finish(context: JobContext, ck: Checkpoint, key: str) -> None:
    """The loop ran out: it yields nothing when the job resumes."""
    with ck.lock:
        ck.finished.append(key)
        ck.cursors.pop(key, None)
        ck.dirty = True
    context._report_soon()


def _interrupt_if_stopping(context: JobContext, stop: StopFlag | None) -> None:
    if stop is not None and stop.is_set():
        raise JobInterrupted("the worker is stopping: handed back before the loop's next item")


def _interrupt(context: JobContext, key: str, cursor: Any) -> None:
    """The worker is stopping: end the attempt here (its cursor is written as it ends)."""
    raise JobInterrupted(f"the worker is stopping: handed back after {key}'s item {show(cursor)}")


# -- step ------------------------------------------------------------------------------------------


def step(
    context: JobContext,
    name: Any,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    atomic: bool,
) -> Any:
    """``current_job().step``: the saved result, or ``fn``'s, saved before it is returned."""
    name = name_of("step()", name)
    if not callable(fn):
        raise TypeError(f"step({name!r}): fn must be callable, got {type(fn).__name__} {show(fn)}")
    ck = context._loaded_checkpoint()
    if name in ck.ran:
        raise ValueError(f"step(): two steps named {name!r} in one attempt; give each a name of its own")
    ck.ran.add(name)
    if name in ck.steps:
        return json.loads(_dumps(ck.steps[name]))
    if atomic:
        return _atomic_step(context, ck, name, fn, args, kwargs)
    value = _result(name, fn(*args, **kwargs))
    with ck.lock:
        ck.steps[name] = value
        ck.dirty = True
    context._save_checkpoint(f"step {name!r}")
    return json.loads(_dumps(value))


def _result(name: str, result: Any) -> Any:
    """``result`` as saved (a JSON copy), or a clear error: not JSON, or over OUTPUT_MAX_BYTES."""
    if inspect.isawaitable(result):
        close = getattr(result, "close", None)
        if close is not None:
            close()
        raise TypeError(f"step({name!r}): fn returned {type(result).__name__}; step runs plain functions")
    try:
        text = _dumps(result)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"step({name!r}): the result must be a JSON value, got {show(result)}: {exc}"
        ) from None
    size, limit = len(text.encode("utf-8", "surrogatepass")), int(jobs_settings.OUTPUT_MAX_BYTES)
    if size > limit:
        raise ValueError(
            f"step({name!r}): the result is {size} bytes of JSON; the limit is {limit} (OUTPUT_MAX_BYTES)"
        )
    _text(f"step({name!r})'s result", text)
    return json.loads(text)


def _atomic_step(
    context: JobContext,
    ck: Checkpoint,
    name: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """``fn`` and the step's saved result in one transaction on the queue's database, fenced by
    the claim: both commit or neither does."""
    alias = context._alias
    if context._on_loop():
        raise RuntimeError(
            f"step({name!r}, atomic=True) on the event loop of an async def handler: its transaction "
            "needs the thread's connection; call it through sync_to_async"
        )
    conn = connections[alias]
    if conn.in_atomic_block and not context._inline_writes():
        raise RuntimeError(
            f"step({name!r}, atomic=True) inside a transaction on {alias!r}: the step opens its own, so "
            "that its writes and its saved result commit together; call it outside transaction.atomic()"
        )
    with ck.lock:
        ck.stepping = True
    sent = False
    try:
        with transaction.atomic(using=alias):
            value = _result(name, fn(*args, **kwargs))
            with ck.lock:
                body = ck.text((name, value))
            sent = True
            with conn.cursor() as c:
                c.execute(CHECKPOINT_SQL, [body, context.id, context._token])
                if c.rowcount != 1:
                    raise ClaimLost(
                        f"step({name!r}, atomic=True): this attempt no longer holds job {context.id}'s "
                        "claim (its lease was taken over); the step's writes are rolled back"
                    )
        with ck.lock:
            ck.steps[name] = value
    except BaseException:
        if sent:
            # Its commit may have happened or not: a later write could only be older than it.
            ck.frozen = True
        raise
    finally:
        with ck.lock:
            ck.stepping = False
    return json.loads(_dumps(value))
