"""rust-web-server's cron grammar: parsed and checked here, due times computed by croniter.

Six fields, seconds first, UTC: ``second minute hour day-of-month month day-of-week``. Each field
is ``*``, ``N``, ``N-M``, ``*/S`` or a comma list of those; day-of-week is 0-6 with 0 = Sunday, and
a day must match day-of-month AND day-of-week (not classic cron's OR).

Extensions (see docs/schedules.md): ``N-M/S``; five fields (classic cron, second 0); month names
``jan``-``dec`` and weekday names ``sun``-``sat``; 7 for Sunday; the aliases ``@yearly``,
``@annually``, ``@monthly``, ``@weekly``, ``@daily``, ``@midnight`` and ``@hourly``. Everything else
croniter would take (``L``, ``W``, ``#``, ``?``, ``H``, ``R``, a year field, wrapping ranges such as
``5-1``, ``N/S``) is refused, so an expression means the same here as in rust-web-server.

The expression is parsed into sets of numbers, and croniter is given those sets as plain lists, so
no croniter quirk (names, 7, wrap-around) can change what the expression means.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from functools import lru_cache

#: (name, lowest, highest) of the six fields, in order; day-of-week also takes 7 for Sunday.
FIELDS = (
    ("second", 0, 59),
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day-of-month", 1, 31),
    ("month", 1, 12),
    ("day-of-week", 0, 6),
)
MONTHS = {m: i for i, m in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split(), start=1)}
WEEKDAYS = {d: i for i, d in enumerate("sun mon tue wed thu fri sat".split())}
ALIASES = {
    "@yearly": "0 0 0 1 1 *",
    "@annually": "0 0 0 1 1 *",
    "@monthly": "0 0 0 1 * *",
    "@weekly": "0 0 0 * * 0",
    "@daily": "0 0 0 * * *",
    "@midnight": "0 0 0 * * *",
    "@hourly": "0 0 * * * *",
}
#: The longest day each month can have (February: 29, in leap years).
MONTH_DAYS = {1: 31, 2: 29, 3: 31, 4: 30, 5: 31, 6: 30, 7: 31, 8: 31, 9: 30, 10: 31, 11: 30, 12: 31}
#: The stored expression is a VARCHAR(255) (rws_job_schedules.cron).
MAX_LENGTH = 255
#: The Gregorian calendar repeats every 400 years, so an expression that fires at all fires within
#: that many years of any time (Feb 29 on a given weekday can be 40 years apart).
SEARCH_YEARS = 400

_ITEM = re.compile(r"^(?:(?P<star>\*)|(?P<lo>[0-9a-zA-Z]+)(?:-(?P<hi>[0-9a-zA-Z]+))?)(?:/(?P<step>[0-9]+))?$")
_ITEM_HELP = "each comma-separated item must be *, N, N-M, */S or N-M/S"


class CronError(ValueError):
    """An invalid cron expression; the message names it and says what is wrong."""


class CronNeverFires(CronError):
    """A well-formed expression that matches no time at all, such as ``0 0 0 30 2 *``."""


@dataclass(frozen=True)
class Cron:
    """A parsed expression: the sets of seconds, minutes, hours, days, months and weekdays."""

    text: str
    second: frozenset[int]
    minute: frozenset[int]
    hour: frozenset[int]
    day: frozenset[int]
    month: frozenset[int]
    weekday: frozenset[int]  # 0 = Sunday

    @property
    def croniter_expr(self) -> str:
        """The same sets as a six-field, seconds-first expression of plain numbers."""
        parts = []
        for (_, lo, hi), values in zip(FIELDS, self._sets(), strict=True):
            full = values == frozenset(range(lo, hi + 1))
            parts.append("*" if full else ",".join(str(v) for v in sorted(values)))
        return " ".join(parts)

    def _sets(self) -> tuple[frozenset[int], ...]:
        return (self.second, self.minute, self.hour, self.day, self.month, self.weekday)

    def matches(self, t: int) -> bool:
        """True if unix second ``t`` is a due time."""
        d = dt.datetime.fromtimestamp(t, dt.timezone.utc)
        return (
            d.second in self.second
            and d.minute in self.minute
            and d.hour in self.hour
            and d.day in self.day
            and d.month in self.month
            and (d.weekday() + 1) % 7 in self.weekday
        )

    def next_after(self, t: int) -> int:
        """The first due time strictly after unix second ``t``."""
        # Imported at the first due time asked for: a worker without schedules never loads croniter
        # and dateutil, about 1 MB of its memory (tests/test_imports.py
        # test_a_worker_without_schedules_does_not_load_croniter).
        from croniter import CroniterBadDateError, croniter

        start = dt.datetime.fromtimestamp(int(t), dt.timezone.utc)
        try:
            it = croniter(
                self.croniter_expr,
                start,
                second_at_beginning=True,
                day_or=False,
                max_years_between_matches=SEARCH_YEARS,
            )
            nxt = int(it.get_next(float))
            while nxt <= t:  # croniter answers strictly after start; this only guards that promise
                nxt = int(it.get_next(float))
        except CroniterBadDateError:
            raise CronNeverFires(f"cron expression {self.text!r} has no due time after {t}") from None
        return nxt


def parse(expr: object) -> Cron:
    """Parse ``expr``, or raise CronError (CronNeverFires if it can never fire) saying why."""
    if not isinstance(expr, str):
        raise CronError(f"cron expression {expr!r} must be a string, not {type(expr).__name__}")
    return _parse(expr)


def validate(expr: object) -> str:
    """Return the expression with its whitespace normalised, or raise CronError."""
    return parse(expr).text


def next_after(expr: object, t: int) -> int:
    """The first due time of ``expr`` strictly after unix second ``t``."""
    return parse(expr).next_after(t)


@lru_cache(maxsize=1024)
def _parse(expr: str) -> Cron:
    text = " ".join(expr.split())
    if not text:
        raise CronError(f"cron expression {expr!r} is empty")
    if len(text) > MAX_LENGTH:
        short = text[:40] + "..."
        raise CronError(f"cron expression {short!r} is {len(text)} characters; the limit is {MAX_LENGTH}")
    fields = text.split(" ")
    if text.startswith("@"):
        if len(fields) != 1 or text.lower() not in ALIASES:
            raise CronError(f"cron expression {expr!r} is not a known alias; use one of {', '.join(ALIASES)}")
        fields = ALIASES[text.lower()].split(" ")
    elif len(fields) == 5:
        fields = ["0", *fields]
    elif len(fields) != 6:
        raise CronError(
            f"cron expression {expr!r} has {len(fields)} field{'s' if len(fields) > 1 else ''}; it needs 6 "
            "(second minute hour day-of-month month day-of-week), or 5 without the second"
        )
    sets = [_field(expr, spec, value) for spec, value in zip(FIELDS, fields, strict=True)]
    cron = Cron(text, *sets)
    if not any(day <= MONTH_DAYS[month] for month in cron.month for day in cron.day):
        # Every date that exists falls on every weekday within 400 years, so only day-of-month
        # against month can make an expression never fire.
        raise CronNeverFires(
            f"cron expression {expr!r} never fires: "
            f"day-of-month {fields[3]!r} never occurs in month {fields[4]!r}"
        )
    return cron


def _field(expr: str, spec: tuple[str, int, int], field: str) -> frozenset[int]:
    name, lo, hi = spec
    names = MONTHS if name == "month" else WEEKDAYS if name == "day-of-week" else {}
    top = 7 if name == "day-of-week" else hi
    values: set[int] = set()
    for item in field.split(","):
        m = _ITEM.match(item)
        if m is None or (m["step"] is not None and m["lo"] is not None and m["hi"] is None):
            hint = f" ({'jan-dec' if name == 'month' else 'sun-sat'} work too)" if names else ""
            raise CronError(
                f"cron expression {expr!r}: cannot read the {name} field {field!r}; {_ITEM_HELP}{hint}"
            )
        if m["star"]:
            start, end = lo, hi
        else:
            start = _value(expr, name, m["lo"], lo, top, names)
            end = start if m["hi"] is None else _value(expr, name, m["hi"], lo, top, names)
            if start > end:
                raise CronError(
                    f"cron expression {expr!r}: the {name} range {item!r} is reversed; "
                    "write it low-high (two ranges to wrap around)"
                )
        step = 1 if m["step"] is None else int(m["step"])
        if step < 1:
            raise CronError(f"cron expression {expr!r}: the {name} step in {item!r} must be at least 1")
        values.update(range(start, end + 1, step))
    if name == "day-of-week" and 7 in values:
        values.discard(7)
        values.add(0)
    return frozenset(values)


def _value(expr: str, name: str, token: str, lo: int, hi: int, names: dict[str, int]) -> int:
    if token.isdigit():
        value = int(token)
        if not lo <= value <= hi:
            extra = " (7 is Sunday too)" if name == "day-of-week" else ""
            raise CronError(f"cron expression {expr!r}: {name} {value} is out of range {lo}-{hi}{extra}")
        return value
    if token.lower() in names:
        return names[token.lower()]
    raise CronError(f"cron expression {expr!r}: {token!r} is not a valid {name}")
