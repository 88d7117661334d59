"""Pausing queues: pause_queue, resume_queue, paused_queues, and the queues a worker claims from
(the limited queues of RWS_JOBS["QUEUES"] apart: limited_claims.py claims those).

A pause is a row of ``rws_queues`` with ``paused`` set, so it holds for every worker on every
machine and survives restarts. Workers read the paused queues at most QueueFilter.REFRESH seconds
apart (and at once when woken by a hint: a resume on PostgreSQL sends a NOTIFY; and at each idle
poll while a queue is paused, where MariaDB/MySQL send no hint), and claim only
from queues that are not paused; running jobs finish. Invariant: a worker claims from a paused
queue only within REFRESH seconds of the pause
(tests/test_pauses.py::test_a_paused_queue_starts_nothing_while_others_run).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

from django.db import connections, transaction

from ..database import clock, wakeup
from ..database.backends import backend_for
from ..database.connections import queue_alias
from ..database.validation import queue_name
from ..models import Queue
from .limits import QueueLimits, configured


def pause_queue(name: str, *, using: str | None = None) -> None:
    """Stop every worker from claiming jobs of queue ``name`` until ``resume_queue(name)``."""
    name = queue_name(name)
    alias = queue_alias(using)
    with transaction.atomic(using=alias):
        updated = Queue.objects.using(alias).filter(name=name).update(paused=True, paused_at=_now(alias))
        if not updated:
            _create_paused(alias, name)
    _wake(alias)


def resume_queue(name: str, *, using: str | None = None) -> None:
    """Let workers claim jobs of queue ``name`` again; idle workers are woken."""
    name = queue_name(name)
    alias = queue_alias(using)
    Queue.objects.using(alias).filter(name=name, paused=True).update(paused=False)
    _wake(alias)


def paused_queues(*, using: str | None = None) -> list[str]:
    """The names of the paused queues, in name order."""
    alias = queue_alias(using)
    paused = Queue.objects.using(alias).filter(paused=True).order_by("name")
    return list(paused.values_list("name", flat=True))


def _now(alias: str) -> int:
    return int(clock.now(alias))


def _create_paused(alias: str, name: str) -> None:
    """Insert the queue's row, paused; a row another process inserted meanwhile is paused instead."""
    from django.db import IntegrityError

    try:
        with transaction.atomic(using=alias):
            Queue.objects.using(alias).create(name=name, paused=True, paused_at=_now(alias))
    except IntegrityError:
        Queue.objects.using(alias).filter(name=name).update(paused=True, paused_at=_now(alias))


def _wake(alias: str) -> None:
    """At commit, wake this process's workers and, on PostgreSQL, every worker that LISTENs."""

    def wake() -> None:
        wakeup.notify()
        if backend_for(connections[alias]).features.wakeup == "listen":
            with connections[alias].cursor() as c:
                c.execute("SELECT pg_notify('rws_jobs', '')")

    transaction.on_commit(wake, using=alias)


#: What QueueFilter.queues is when every queue a worker serves is paused: claim nothing.
NONE_UNPAUSED: list[str] = []


class QueueFilter:
    """The queues a worker claims from: its own (None: every queue) less the paused ones.

    ``queues`` is the worker's own list, unchanged, while nothing it serves is paused, so its
    claim statements stay the ones it prepared. With a queue paused, a worker that serves every
    queue claims from the queues that hold pending jobs, read at each refresh; a job enqueued
    in a new queue then waits for the next refresh.
    """

    #: The longest time (seconds) between two reads of the paused queues.
    REFRESH = 1.0

    def __init__(self, queues: Sequence[str] | None, limits: dict[str, QueueLimits] | None = None):
        self.own = list(queues) if queues is not None else None
        self.queues: list[str] | None = self.own
        self.paused: frozenset[str] = frozenset()
        #: RWS_JOBS["QUEUES"]'s limits: their queues are claimed by claim_limited, one at a time.
        self.limits = configured() if limits is None else limits
        #: The limited queues this worker serves that are not paused (claim_limited's).
        self.limited: list[str] = []
        self.read_at = -math.inf
        #: Read again before the next claim, whatever the time (set when a hint woke the worker).
        self.recheck = False

    def stale(self) -> bool:
        return self.recheck or time.monotonic() - self.read_at >= self.REFRESH

    def refresh(self, store: Any) -> None:
        """Read the paused queues on ``store``'s connection and set ``queues``."""
        with store.cursor() as c:
            c.execute("SELECT name FROM rws_queues WHERE paused = %s", [True])
            paused = frozenset(row[0] for row in c.fetchall())
            left_out = paused | set(self.limits)
            if not left_out:
                self.queues = self.own
            elif self.own is not None:
                self.queues = [q for q in self.own if q not in left_out] or NONE_UNPAUSED
            else:
                self.queues = [q for q in pending_queues(c) if q not in left_out] or NONE_UNPAUSED
        self.limited = [q for q in self.limits if q not in paused and (self.own is None or q in self.own)]
        self.paused = paused
        self.read_at = time.monotonic()
        self.recheck = False

    def current(self, store: Any) -> list[str] | None:
        if self.stale():
            self.refresh(store)
        return self.queues


def pending_queues(c: Any) -> list[str]:
    """The queues that hold pending jobs, in name order: one probe of the queue index each (a
    loose index scan), where SELECT DISTINCT would read every pending row's entry."""
    names: list[str] = []
    while True:
        if names:
            c.execute("SELECT MIN(queue) FROM rws_jobs WHERE status = 'pending' AND queue > %s", [names[-1]])
        else:
            c.execute("SELECT MIN(queue) FROM rws_jobs WHERE status = 'pending'")
        row = c.fetchone()
        if row is None or row[0] is None:
            return names
        names.append(row[0])
