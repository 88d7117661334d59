"""What a handler's exception makes of its attempt: the handler's own decision (``Snooze``,
``Retry``, ``Fail``, ``Cancel``), its job type's (``fail_on``, ``backoff``), or a plain failure
on RWS_JOBS's backoff. ``decide`` runs where the exception is caught (run.execute, in the
worker's thread or the process pool's child) and turns it into an outcome that ``record``
writes (outcomes.py) and that pickles for the child's answer.

Invariants (tests/test_outcomes.py): a snooze never charges an attempt; an exact delay
(``Retry(delay=)``) is not spread; a type's backoff that raises or returns something that is
not a delay is logged and the job retries on RWS_JOBS's backoff: never a lost or stuck job.
"""

from __future__ import annotations

import logging
import traceback
from typing import Protocol

from ..exceptions import Cancel, Fail, Retry, Snooze
from ..queue.backoff import Backoff, jittered
from ..queue.store import Claimed
from .outcomes import TRACEBACK_MAX, CancelledByHandler, Failure, Snoozed, describe, storable

logger = logging.getLogger("django_rws_jobs")


class Decides(Protocol):
    """What a job type says of its failures: a handler's JobSpec, a django.tasks RwsTask."""

    @property
    def backoff(self) -> Backoff | None: ...

    @property
    def fail_on(self) -> tuple[type[BaseException], ...]: ...


def decide(exc: Exception, spec: Decides | None, job: Claimed) -> str:
    """The outcome (the error ``record`` gets) of an attempt whose handler raised ``exc``."""
    if isinstance(exc, Snooze):
        return Snoozed(describe(exc), exc.seconds)
    if isinstance(exc, Cancel):
        return CancelledByHandler(describe(exc))
    if isinstance(exc, Fail) or (spec is not None and spec.fail_on and isinstance(exc, spec.fail_on)):
        return Failure(describe(exc), dead=True)
    if isinstance(exc, Retry) and exc.delay is not None:
        return Failure(describe(exc), delay=exc.delay)
    if spec is not None and spec.backoff is not None:
        return Failure(describe(exc), delay=typed_delay(spec, job, exc))
    return describe(exc)


def decided(exc: Exception, spec: Decides | None, job: Claimed) -> tuple[str, str | None]:
    """``decide``'s outcome and the traceback being handled (none for a snooze, no error); call
    it inside the ``except`` that caught ``exc``."""
    outcome = decide(exc, spec, job)
    if isinstance(outcome, Snoozed):
        return outcome, None
    return outcome, storable(traceback.format_exc(), TRACEBACK_MAX, keep_end=True)


def typed_delay(spec: Decides, job: Claimed, exc: Exception) -> float | None:
    """The job type's backoff before the retry after this failure, spread by its jitter; None
    (RWS_JOBS's backoff) when the type's callable raises or returns something that is not a delay."""
    assert spec.backoff is not None
    try:
        return jittered(spec.backoff.delay(job.attempts + 1, exc), spec.backoff.spread())
    except Exception as bad:
        logger.error(
            "job %s (%s): its type's backoff failed (%s: %s); RWS_JOBS's backoff applies",
            job.id,
            job.job_type,
            type(bad).__name__,
            bad,
        )
        return None
