"""Exceptions a handler may meet; only the standard library here (the package imports it early)."""

from __future__ import annotations

import math
from datetime import timedelta


class JobTimeout(BaseException):
    """Raised in a handler's thread when its job runs past its time limit (the thread pool).

    A BaseException, as Dramatiq's TimeLimitExceeded, so that a handler's ``except Exception``
    does not swallow it; a handler may catch it to clean up, and the job fails all the same.
    """


#: How last_error starts for a job that ran past its limit.
TIMED_OUT = f"{JobTimeout.__name__}: "


def timeout_message(seconds: float) -> str:
    """What last_error records for a job that ran past its limit."""
    return f"{TIMED_OUT}ran longer than {seconds:g} s"


class JobCancelled(BaseException):
    """Raised in a handler's thread when its job is cancelled while it runs (the thread pool;
    the process pool terminates the child). A BaseException, as JobTimeout: ``except Exception``
    does not swallow it; the job ends ``cancelled`` and is not retried."""


#: How last_error starts for a cancelled job.
CANCELLED = f"{JobCancelled.__name__}: "


def cancel_message(by: str | None, running: bool) -> str:
    """What last_error records for a cancelled job."""
    who = f" by {by}" if by else ""
    return f"{CANCELLED}cancelled{who} {'while it ran' if running else 'before it ran'}"


class JobInterrupted(BaseException):
    """Raised in a handler by ``current_job().iterate`` at an item boundary once its worker was
    asked to stop (SIGTERM, SIGINT), after the loop's cursor is saved; a handler that loops on its
    own may raise it when it sees ``current_job().stopping``. The job is handed back: pending
    again, its attempt not charged, ``Job.resumptions`` counted; its next claim resumes from its
    checkpoint. A BaseException, as JobCancelled: ``except Exception`` does not swallow it."""

    def __init__(self, reason: str = "") -> None:
        self.reason = str(reason)
        super().__init__(self.reason)


#: The longest delay a handler may ask for (Snooze, Retry): a year, as RWS_JOBS["BACKOFF_MAX"].
DELAY_MAX = 365 * 86400


def delay_seconds(what: str, value: object) -> float:
    """``value`` (a number or a timedelta) as seconds, or a ValueError naming it and the limit:
    finite, in [0, DELAY_MAX] (tests/test_outcomes.py::test_a_bad_delay_is_a_clear_error)."""
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number of seconds or a timedelta, got {value!r}")
    if not math.isfinite(value) or not 0 <= value <= DELAY_MAX:
        raise ValueError(f"{what} must be a finite number of seconds in [0, {DELAY_MAX}], got {value!r}")
    return float(value)


class Snooze(Exception):  # noqa: N818 (the SPEC's name: a decision, not an error)
    """Raised by a handler: not ready yet. The job is pending again, due after ``seconds`` (a
    number or a timedelta); the attempt is not charged (``attempts`` unchanged), ``Job.snoozes``
    counts it, and the job keeps its unique key, its concurrency key and its batch.

    An Exception, unlike JobTimeout and JobCancelled: a handler raises it on purpose. A handler
    that catches it and returns has succeeded."""

    def __init__(self, seconds: float | timedelta) -> None:
        self.seconds = delay_seconds("Snooze(seconds)", seconds)
        super().__init__(f"snoozed for {self.seconds:g} s")


class Retry(Exception):  # noqa: N818 (the SPEC's name)
    """Raised by a handler: this attempt failed (charged; last_error says ``reason``) and the
    next one is due after ``delay`` seconds (a number or a timedelta: exact, no jitter) instead of
    the backoff; ``delay=None`` keeps the backoff. Out of retries, the job is dead as usual."""

    def __init__(self, delay: float | timedelta | None = None, reason: str = "") -> None:
        self.delay = None if delay is None else delay_seconds("Retry(delay)", delay)
        self.reason = str(reason)
        super().__init__(self.reason)


class Fail(Exception):  # noqa: N818 (the SPEC's name)
    """Raised by a handler: a permanent failure. The job moves to the dead-letter list now,
    whatever retries it has left, and ``job_dead`` is sent."""

    def __init__(self, reason: str = "") -> None:
        self.reason = str(reason)
        super().__init__(self.reason)


class Cancel(Exception):  # noqa: N818 (the SPEC's name)
    """Raised by a handler: the work is obsolete. The job ends ``cancelled`` as an operator's
    ``cancel()`` would end it: no retry, not on the dead-letter list; its batch and its
    dependents see a cancelled job, and ``job_cancelled`` is sent."""

    def __init__(self, reason: str = "") -> None:
        self.reason = str(reason)
        super().__init__(self.reason)
