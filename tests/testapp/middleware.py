"""Middleware the tests configure (RWS_JOBS["MIDDLEWARE"]): each records what it saw, in this
process (EVENTS) and, when it runs a job, in the database (a Run row), which other processes see."""

from __future__ import annotations

import json
import os

#: What the middleware of this process saw, in order.
EVENTS: list[tuple] = []


class Outer:
    def enqueue(self, job, call_next):
        EVENTS.append(("outer enqueue", job.job_type, job.many))
        result = call_next()
        EVENTS.append(("outer enqueued", list(job.ids)))
        return result

    def execute(self, job, call_next):
        EVENTS.append(("outer execute", job.id))
        try:
            return call_next()
        finally:
            EVENTS.append(("outer executed", job.id))


class Tenant:
    """Stores a tenant with every job, and traces it around each attempt."""

    def enqueue(self, job, call_next):
        job.metadata.setdefault("tenant", "acme")
        EVENTS.append(("tenant enqueue", job.job_type, job.many))
        result = call_next()
        EVENTS.append(("tenant enqueued", list(job.ids)))
        return result

    def execute(self, job, call_next):
        from .models import Run

        EVENTS.append(("tenant execute", job.id))
        Run.objects.create(
            kind="middleware", payload=json.dumps([job.id, job.metadata.get("tenant")]), pid=os.getpid()
        )
        return call_next()


class Refuse:
    """Refuses to enqueue a job whose metadata says "refuse"; fails an attempt whose says "fail"."""

    def enqueue(self, job, call_next):
        if job.metadata.get("refuse"):
            raise PermissionError("refused by the middleware")
        return call_next()

    def execute(self, job, call_next):
        if job.metadata.get("fail"):
            raise PermissionError("failed by the middleware")
        return call_next()


class RefuseAfter:
    """Lets the call store its jobs, then raises."""

    def enqueue(self, job, call_next):
        call_next()
        EVENTS.append(("refuse after", list(job.ids)))
        raise PermissionError("refused after call_next()")


class OnlyExecute:
    def execute(self, job, call_next):
        EVENTS.append(("only execute", job.id))
        return call_next()
