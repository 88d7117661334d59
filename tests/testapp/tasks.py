"""Tasks (django.tasks) used by the tests; like the handlers, they leave traces in the database."""

import asyncio
import os
import time

from .jobs import _trace

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport, when installed
    from django_tasks import task

from django_rws_jobs.tasks import task as rws_task


@task
def record(payload: str) -> dict:
    _trace("task", payload)
    return {"payload": payload, "pid": os.getpid()}


@task(queue_name="emails", priority=7)
def email(to: str, subject: str = "") -> str:
    _trace("email", f"{to}:{subject}")
    return f"sent to {to}"


@task
def fail(message: str) -> None:
    _trace("task-fail", message)
    raise ValueError(message)


@task(takes_context=True)
def attempts(context, succeed_on: int) -> int:
    """Fails until attempt ``succeed_on``; returns the attempt it succeeded on."""
    _trace("attempt", str(context.attempt))
    if context.attempt < succeed_on:
        raise RuntimeError(f"attempt {context.attempt}")
    return context.attempt


@task
async def asleep(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "awake"


@task
def sleep(seconds: float) -> float:
    _trace("task-start", str(seconds))
    time.sleep(seconds)
    _trace("task-end", str(seconds))
    return seconds


@task
def unserialisable() -> object:
    return object()


@task
def exit_worker() -> None:
    _trace("task-exit", "")
    os._exit(7)


@task
def noop() -> None:
    pass


@rws_task(max_attempts=1)
def once(message: str) -> None:
    raise ValueError(message)


@rws_task(unique=True)
def unique(key: str) -> str:
    return key


@rws_task(timeout=0.5, max_attempts=2)
def spin(payload: str) -> None:
    """Runs for ever in small steps; its limit of 0.5 s stops it."""
    from .jobs import _forever

    _trace("task-spin", payload)
    _forever(0.02)


@rws_task(concurrency_key=lambda account, **kwargs: f"account:{account}", concurrency_limit=2)
def sync_account(account: int, full: bool = False) -> int:
    _trace("task-sync", str(account))
    return account


def plain(payload: str) -> None:
    """Not a task: a task made of it at enqueue time is named by a path a worker cannot use."""


@task
def whoami() -> dict:
    from django_rws_jobs import current_job

    ctx = current_job()
    return {"job_type": ctx.job_type, "attempt": ctx.attempt, "queue": ctx.queue}


@rws_task(takes_context=True)
def tagged(context, fail: bool = False) -> dict:
    """Returns the metadata its context reads; adds "seen" to it and saves it; fails if told."""
    seen = dict(context.metadata)
    context.metadata["seen"] = True
    context.save_metadata()
    if fail:
        raise RuntimeError("asked to fail")
    return seen


@rws_task(max_attempts=1)
def report_then_fail(steps: int) -> None:
    """Reports ``steps`` steps of 4 with the progress writer's rounds held off, then fails: only
    the attempt's end writes its last report."""
    from django_rws_jobs import current_job
    from django_rws_jobs.running import reports

    ctx = current_job()
    reports.writer(ctx._alias).last_write = time.monotonic() + 3600
    for i in range(steps):
        ctx.progress(i + 1, 4, f"step {i + 1}")
    raise RuntimeError("asked to fail")


@rws_task(max_attempts=4, fail_on=(LookupError,), backoff={"initial": 40, "jitter": 0})
def decide(payload: str) -> str:
    """Raises what ``payload`` names (jobs._decision), else returns it."""
    from .jobs import _decision

    _trace("task-decide", payload)
    _decision(payload)
    return payload


@rws_task(max_attempts=4)
async def async_decide(payload: str) -> str:
    from asgiref.sync import sync_to_async

    from .jobs import _decision

    await sync_to_async(_trace)("task-async-decide", payload)
    _decision(payload)
    return payload


@task
def long_count(count: int) -> int:
    """Numbers 0..count-1 through current_job().iterate; the first time item 2 is reached, the
    task is interrupted as at a worker's stop (tests/test_long_jobs.py)."""
    from django_rws_jobs import JobInterrupted, current_job

    from .models import Run

    done = 0
    for n in current_job().iterate(lambda cursor: ((i + 1, i) for i in range(cursor or 0, count))):
        _trace("task-item", str(n))
        if n == 2 and not Run.objects.filter(kind="task-interrupt").exists():
            _trace("task-interrupt", "")
            raise JobInterrupted("as at a deploy")
        done += 1
    return done


@rws_task(unique=True, unique_for=60)
def throttled(n: int) -> int:
    """At most one run per minute per argument (tests/test_enqueue_once.py)."""
    return n
