"""Queue limits: ``RWS_JOBS["QUEUES"] = {"mailers": {"concurrency": 10, "rate_limit": "100/m"}}``.

Parsing and checking only; limited_claims.py keeps them. This module imports
no model, so the system checks can use it before the app registry is ready.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from ..conf import jobs_settings
from ..database.validation import CONCURRENCY_MAX, queue_name, show

#: A rate limit's unit and its window in seconds (Celery's notation).
PERIODS = {"s": 1, "m": 60, "h": 3600}
MAX_CONCURRENCY = CONCURRENCY_MAX
MAX_RATE = 1_000_000
KEYS = ("concurrency", "rate_limit")
#: A rate as written: ASCII digits, a slash, a unit; spaces around it only. Not str.isdigit,
#: which takes superscripts and other scripts' digits that int() then refuses or reads
#: (tests/test_limits.py::test_every_bad_rate_gets_the_usual_message).
RATE = re.compile(r"\s*([0-9]+)/([smh])\s*", re.ASCII)


@dataclasses.dataclass(frozen=True)
class QueueLimits:
    """At most ``concurrency`` running jobs (None: no limit) and at most ``rate`` claims per
    window of ``period`` seconds (None: no limit), across every worker."""

    concurrency: int | None = None
    rate: int | None = None
    period: int = 1


def parse_rate(value: Any, name: str) -> tuple[int, int]:
    """``"N/s"``, ``"N/m"`` or ``"N/h"`` -> (N, window seconds); TypeError/ValueError naming the value."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str such as '100/m', got {type(value).__name__} {show(value)}")
    match = RATE.fullmatch(value)
    if match is None:
        raise ValueError(f"{name} is {show(value)}; it must be N/s, N/m or N/h, such as '100/m'")
    count, unit = match.groups()
    digits = count.lstrip("0")
    # (int() refuses thousands of digits; more than MAX_RATE's are out of range anyway.)
    if len(digits) > len(str(MAX_RATE)) or not 1 <= int(digits or "0") <= MAX_RATE:
        raise ValueError(f"{name} is {show(value)}; N must be in [1, {MAX_RATE}]")
    return int(digits), PERIODS[unit]


def queues_dict(raw: Any) -> dict[Any, Any]:
    if not isinstance(raw, dict):
        raise TypeError(f"RWS_JOBS['QUEUES'] must be a dict of queue name -> limits, got {show(raw)}")
    return raw


def entry_where(name: Any, value: Any) -> str:
    """Check one entry's queue name, that it is a dict and that it has no unknown keys; return
    the words that name it in messages."""
    queue_name(name, "RWS_JOBS['QUEUES'] key")
    where = f"RWS_JOBS['QUEUES'][{show(name)}]"
    if not isinstance(value, dict):
        raise TypeError(f"{where} must be a dict with 'concurrency' and/or 'rate_limit', got {show(value)}")
    unknown = sorted(map(repr, set(value) - set(KEYS)))
    if unknown:
        raise ValueError(f"{where} has unknown keys {', '.join(unknown)}; known: {', '.join(KEYS)}")
    return where


def parse_concurrency(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CONCURRENCY:
        raise ValueError(f"{name} is {show(value)}; it must be an integer in [1, {MAX_CONCURRENCY}]")
    return value


def parse_queues(raw: Any) -> dict[str, QueueLimits]:
    """RWS_JOBS["QUEUES"] -> queue name -> its limits (queues without a limit left out)."""
    limits = {}
    for name, value in queues_dict(raw).items():
        where = entry_where(name, value)
        concurrency = parse_concurrency(value.get("concurrency"), f"{where}['concurrency']")
        rate, period = (None, 1)
        if value.get("rate_limit") is not None:
            rate, period = parse_rate(value["rate_limit"], f"{where}['rate_limit']")
        if concurrency is not None or rate is not None:
            limits[name] = QueueLimits(concurrency, rate, period)
    return limits


def configured() -> dict[str, QueueLimits]:

    return parse_queues(jobs_settings.QUEUES)
