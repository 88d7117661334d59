"""How long a failed job waits before its retry: the backoff of ``RWS_JOBS`` or of its job type
(``@job(backoff=...)``), and the jitter that spreads every computed delay.

Invariants (tests/test_outcomes.py):

- A computed delay is spread by up to ``jitter`` (``RWS_JOBS["BACKOFF_JITTER"]``, or the type's
  dict's ``jitter``) either way, never more: a thousand jobs failing together do not retry in the
  same second, and none retries at 0 s for want of a wait ("full jitter"). An exact delay
  (``Retry(delay=...)``) is not spread.
- A type's backoff is checked when it is registered where it can be (a dict's keys and values, a
  callable's arity is the caller's); what a callable returns is checked at each failure, and a
  callable that raises or returns something that is not a delay gives the global backoff, logged.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..conf import jobs_settings
from ..database.validation import show
from ..exceptions import DELAY_MAX

#: What a backoff dict may hold.
BACKOFF_KEYS = ("initial", "multiplier", "max", "jitter")
#: Bounds as RWS_JOBS's BACKOFF_* settings have them (checks.py).
MULTIPLIER_MAX = 1000

BackoffFunction = Callable[[int, BaseException], Any]


def number(name: str, value: Any, lo: float, hi: float, *, below_hi: bool = False) -> float:
    """``value`` as a float in [lo, hi] ([lo, hi) if ``below_hi``), or an error naming it and
    the range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {show(value)}")
    inside = math.isfinite(value) and lo <= value and (value < hi if below_hi else value <= hi)
    if not inside:
        end = ")" if below_hi else "]"
        raise ValueError(f"{name} {show(value)} is out of range; it must be in [{lo}, {hi}{end}")
    return float(value)


def exponential(attempt: int, initial: float, multiplier: float, cap: float) -> float:
    """initial * multiplier**(attempt-1), at most ``cap`` (attempt 1 for the first retry)."""
    try:
        delay = initial * multiplier ** (attempt - 1)
    except OverflowError:
        delay = cap
    return min(delay, cap)


def jittered(seconds: float, jitter: float) -> float:
    """``seconds`` spread by up to ``jitter`` of it either way."""
    if not jitter or not seconds:
        return seconds
    return seconds * random.uniform(1.0 - jitter, 1.0 + jitter)


@dataclass(frozen=True)
class Backoff:
    """A job type's backoff: a callable ``backoff(attempt, error) -> seconds``, or a dict's
    numbers (a key left out is the setting's)."""

    function: BackoffFunction | None = None
    initial: float | None = None
    multiplier: float | None = None
    max: float | None = None
    jitter: float | None = None

    @classmethod
    def of(cls, value: Any) -> Backoff | None:
        """``@job(backoff=)`` checked: None, a callable or a dict of BACKOFF_KEYS."""
        if value is None:
            return None
        if callable(value):
            return cls(function=value)
        if not isinstance(value, Mapping):
            raise TypeError(
                f"backoff must be a callable backoff(attempt, error) -> seconds or a dict of "
                f"{', '.join(BACKOFF_KEYS)}, got {type(value).__name__} {show(value)}"
            )
        unknown = sorted(set(value) - set(BACKOFF_KEYS), key=str)
        if unknown:
            raise ValueError(f"backoff has unknown key(s) {unknown}; it takes {', '.join(BACKOFF_KEYS)}")
        checked = {
            "initial": ("backoff initial", 0, DELAY_MAX, False),
            "multiplier": ("backoff multiplier", 1, MULTIPLIER_MAX, False),
            "max": ("backoff max", 0, DELAY_MAX, False),
            "jitter": ("backoff jitter", 0, 1, True),
        }
        numbers: dict[str, Any] = {
            key: number(name, value[key], lo, hi, below_hi=below)
            for key, (name, lo, hi, below) in checked.items()
            if key in value
        }
        return cls(**numbers)

    def delay(self, attempt: int, error: BaseException) -> float:
        """Seconds before retry ``attempt``, not spread yet; a ValueError or TypeError if the
        callable's result is not a delay (the caller falls back to the global backoff)."""
        if self.function is not None:
            return number("the backoff's result", self.function(attempt, error), 0, DELAY_MAX)
        return exponential(
            attempt,
            float(jobs_settings.BACKOFF_INITIAL) if self.initial is None else self.initial,
            float(jobs_settings.BACKOFF_MULTIPLIER) if self.multiplier is None else self.multiplier,
            float(jobs_settings.BACKOFF_MAX) if self.max is None else self.max,
        )

    def spread(self) -> float:
        """The jitter of this type's delays."""
        return float(jobs_settings.BACKOFF_JITTER) if self.jitter is None else self.jitter


def backoff_delay(attempt: int) -> float:
    """RWS_JOBS's backoff for retry ``attempt``, not spread yet."""
    return exponential(
        attempt,
        float(jobs_settings.BACKOFF_INITIAL),
        float(jobs_settings.BACKOFF_MULTIPLIER),
        float(jobs_settings.BACKOFF_MAX),
    )
