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
