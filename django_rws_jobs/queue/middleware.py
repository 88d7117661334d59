"""Middleware: ``RWS_JOBS["MIDDLEWARE"]``, classes around enqueuing and running jobs.

Each class is made once, without arguments, and may define either method or both:

- ``enqueue(self, job, call_next)`` around each call of ``enqueue``, ``enqueue_many``, a
  ``django.tasks`` task's ``enqueue`` and ``chain``: ``job`` is an ``Enqueue`` (what is being
  enqueued; keys a middleware puts in ``job.metadata`` are stored with each job, under the
  item's own), ``call_next()`` stores the jobs and returns what the call returns.
- ``execute(self, job, call_next)`` around each attempt of a handler or task: ``job`` is the
  ``JobContext`` (``current_job()``), ``call_next()`` runs the handler and returns its value.

The first class listed is the outermost: its code before ``call_next()`` runs first, its code
after runs last, as Django's request middleware. An exception from an ``enqueue`` reaches the
caller, and nothing of the call is stored, even when it is raised after ``call_next()``: the
enqueue middleware and the call run in a transaction of their own (a savepoint inside the
caller's) (tests/test_middleware.py::test_an_enqueue_middleware_that_raises_after_call_next_stores_nothing).
One from an ``execute`` is the attempt's failure, retried as the handler's own would be
(tests/test_middleware.py::test_the_first_middleware_is_the_outermost).

With no middleware configured, a job pays one truth test of an empty tuple.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from django.core.signals import setting_changed
from django.db import transaction
from django.utils.module_loading import import_string

from ..conf import jobs_settings
from .metadata import metadata_text

T = TypeVar("T")


class Enqueue:
    """What a middleware's ``enqueue`` sees of one enqueue call."""

    __slots__ = ("ids", "job_type", "many", "metadata", "queue", "using")

    def __init__(
        self, job_type: str | None, queue: str | None, metadata: dict[str, Any], many: bool, using: str
    ):
        #: The job type: None for ``enqueue_many`` and ``chain`` (each item has its own).
        self.job_type = job_type
        #: The queue: None for ``enqueue_many`` and ``chain``, and where a job type's default applies.
        self.queue = queue
        #: Metadata stored with the job (``enqueue``: the job's own, which this dict is), or with
        #: each job of the call, under each item's own keys.
        self.metadata = metadata
        #: Whether the call stores many jobs (``enqueue_many``, ``chain``).
        self.many = many
        #: The database alias.
        self.using = using
        #: The ids of the jobs stored, once ``call_next()`` returned.
        self.ids: list[str] = []

    def __repr__(self) -> str:
        return f"Enqueue(job_type={self.job_type!r}, queue={self.queue!r}, many={self.many})"


_loaded: tuple[tuple[Any, ...], tuple[Any, ...]] | None = None


def chains() -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """(the enqueue methods, the execute methods) of RWS_JOBS["MIDDLEWARE"], in its order."""
    global _loaded
    if _loaded is None:
        instances = [load(path) for path in jobs_settings.MIDDLEWARE or ()]
        _loaded = (
            tuple(m.enqueue for m in instances if callable(getattr(m, "enqueue", None))),
            tuple(m.execute for m in instances if callable(getattr(m, "execute", None))),
        )
    return _loaded


def load(path: Any) -> Any:
    """The middleware at ``path`` (a dotted path to a class), made."""
    if not isinstance(path, str):
        raise TypeError(f"RWS_JOBS['MIDDLEWARE'] takes dotted paths, got {type(path).__name__} {path!r}")
    try:
        cls = import_string(path)
    except ImportError as exc:
        raise ImportError(f"RWS_JOBS['MIDDLEWARE']: {path!r} cannot be imported: {exc}") from exc
    if not isinstance(cls, type):
        raise TypeError(f"RWS_JOBS['MIDDLEWARE']: {path!r} is {type(cls).__name__}, not a class")
    if not callable(getattr(cls, "enqueue", None)) and not callable(getattr(cls, "execute", None)):
        raise TypeError(f"RWS_JOBS['MIDDLEWARE']: {path!r} has neither enqueue() nor execute()")
    return cls()


def _reset(setting: str = "", **kwargs: Any) -> None:
    global _loaded
    if setting == "RWS_JOBS":
        _loaded = None


setting_changed.connect(_reset, dispatch_uid="rws_jobs_middleware")


def around(methods: tuple[Any, ...], job: Any, call: Callable[[], T]) -> T:
    """``call()`` inside ``methods`` (the first outermost), each given ``job``."""
    if len(methods) == 1:
        return methods[0](job, call)
    for method in reversed(methods[1:]):
        call = _wrap(method, job, call)
    return methods[0](job, call)


def enqueue_around(methods: tuple[Any, ...], job: Enqueue, call: Callable[[], T]) -> T:
    """``call()`` (which stores jobs) inside the enqueue ``methods``, all in one transaction on
    ``job.using``, so that whatever raises, before or after ``call_next()``, stores nothing."""
    with transaction.atomic(using=job.using):
        return around(methods, job, call)


def many(alias: str, store: Callable[[dict[str, Any]], list[str]]) -> list[str]:
    """``store(metadata)`` (a call that stores many jobs, each with ``metadata`` under its own)
    inside the enqueue middleware; returns the ids."""
    enqueuers = chains()[0]
    if not enqueuers:
        return store({})
    job = Enqueue(None, None, {}, True, alias)

    def call_next() -> list[str]:
        job.ids = store(job.metadata)
        return job.ids

    return enqueue_around(enqueuers, job, call_next)


def _wrap(method: Any, job: Any, inner: Callable[[], T]) -> Callable[[], T]:
    return lambda: method(job, inner)


#: How the queue's own metadata keys begin (a trace context: tracing.CARRIER).
OWN_KEYS = "_rws."


def merged(row_metadata: str | None, extra: dict[str, Any]) -> str | None:
    """A row's metadata text with ``extra``'s keys under its own, but for the queue's own keys
    (``OWN_KEYS``), where the call's win: a trace context copied into an item's metadata gives way
    to the enqueueing call's, as a single ``enqueue``'s does (the middleware writes into its
    job's own metadata)
    (tests/test_tracing.py::test_the_callers_trace_context_wins_over_a_copied_one)."""

    if not extra:
        return row_metadata
    own = json.loads(row_metadata) if row_metadata else {}
    ours = {key: value for key, value in extra.items() if key.startswith(OWN_KEYS)}
    return metadata_text({**extra, **own, **ours})
