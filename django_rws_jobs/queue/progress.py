"""``get_progress``'s answer: what a running job last reported (running/reports.py writes it)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
from typing import Any


@dataclasses.dataclass(frozen=True)
class Progress:
    """A running job's last reported progress (``get_progress``)."""

    current: float
    total: float | None
    message: str | None
    #: When it was written (the queue's clock), within a second of the report.
    updated_at: dt.datetime

    @property
    def fraction(self) -> float | None:
        """``current / total`` between 0 and 1, or None without a positive total."""
        if not self.total or self.total <= 0 or not math.isfinite(self.current):
            return None
        return min(max(self.current / self.total, 0.0), 1.0)


def parse_progress(text: str, at: float | None) -> Progress:
    """The stored report as a Progress. ``progress()`` writes only finite numbers within 2**53;
    a row written otherwise (another program, an older version) reads as NaN for a current and
    None for a total or a message it cannot take, never an error, so that one row cannot break
    a page that lists it
    (tests/test_reports.py::test_a_stored_report_out_of_range_reads_without_an_error)."""
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        value = {}
    when = dt.datetime.fromtimestamp(float(at or 0), tz=dt.timezone.utc)
    current = _number(value.get("current"))
    message = value.get("message")
    return Progress(
        math.nan if current is None else current,
        _number(value.get("total")),
        message if isinstance(message, str) else None,
        when,
    )


def _number(value: Any) -> float | None:
    """``value`` if it is a number a float can hold (an int stays an int), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        finite = math.isfinite(float(value))
    except OverflowError:
        return None
    return value if finite else None
