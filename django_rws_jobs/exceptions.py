"""Exceptions a handler may meet; only the standard library here (the package imports it early)."""

from __future__ import annotations


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
