"""``get_progress``'s answer: what a running job last reported (queue/reports.py writes it)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json


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
        if not self.total or self.total <= 0:
            return None
        return min(max(self.current / self.total, 0.0), 1.0)


def parse_progress(text: str, at: float | None) -> Progress:
    value = json.loads(text)
    when = dt.datetime.fromtimestamp(float(at or 0), tz=dt.timezone.utc)
    return Progress(value.get("current"), value.get("total"), value.get("message"), when)
