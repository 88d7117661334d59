"""The seed's cron grammar, computed by croniter.

Six fields, seconds first, UTC: ``sec min hour day-of-month month day-of-week``, each ``*``, ``N``,
``N-M``, ``*/S``, ``N-M/S`` or a comma list of those; day-of-week 0-6 with 0 = Sunday; a day must
match day-of-month AND day-of-week. Extensions croniter offers and we accept (documented in the
README): five-field classic expressions (second 0), month and weekday names, 7 for Sunday, and the
``@yearly``/``@monthly``/``@weekly``/``@daily``/``@hourly`` aliases.
"""

from __future__ import annotations

import datetime as dt
import re
from functools import lru_cache

from croniter import croniter

ALIASES = {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
FIELD_NAMES = ("second", "minute", "hour", "day-of-month", "month", "day-of-week")
_RANGE = re.compile(r"^(\d+)-(\d+)(?:/\d+)?$")
#: How far ahead a schedule may first fire before it is called never-firing (Feb 29 needs 8 years
#: across a skipped leap year such as 2100).
MAX_YEARS = 30


class CronError(ValueError):
    pass


@lru_cache(maxsize=512)
def validate(expr: str) -> str:
    """Return the expression normalised, or raise CronError saying what is wrong with it."""
    if not isinstance(expr, str) or not expr.strip():
        raise CronError(f"cron expression {expr!r} must be a non-empty string")
    text = " ".join(expr.split())
    if text.lower() in ALIASES:
        return text.lower()
    fields = text.split(" ")
    if len(fields) not in (5, 6):
        raise CronError(
            f"cron expression {expr!r} has {len(fields)} fields; it needs 6 "
            "(second minute hour day-of-month month day-of-week), or 5 without seconds"
        )
    names = FIELD_NAMES if len(fields) == 6 else FIELD_NAMES[1:]
    for name, field in zip(names, fields):
        for part in field.split(","):
            m = _RANGE.match(part)
            if m and int(m.group(1)) > int(m.group(2)):
                raise CronError(f"cron expression {expr!r}: the {name} range {part!r} is reversed")
    try:
        croniter(text, dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc), second_at_beginning=True, day_or=False)
    except Exception as exc:  # croniter's errors are several unrelated classes
        raise CronError(f"cron expression {expr!r} is invalid: {exc}") from None
    return text


def next_after(expr: str, t: int) -> int:
    """The first due time strictly after unix second ``t``; CronError if it never fires."""
    text = validate(expr)
    start = dt.datetime.fromtimestamp(t, dt.timezone.utc)
    try:
        it = croniter(text, start, second_at_beginning=True, day_or=False, max_years_between_matches=MAX_YEARS)
        nxt = int(it.get_next(float))
    except Exception as exc:
        raise CronError(f"cron expression {expr!r} never fires: {exc}") from None
    if nxt <= t:  # croniter returns a time strictly after start; keep the promise explicit
        raise CronError(f"cron expression {expr!r} gave {nxt}, not after {t}")
    return nxt


def check_fires(expr: str, now: int) -> None:
    """Raise CronError if ``expr`` is invalid or has no due time within MAX_YEARS."""
    next_after(expr, now)
