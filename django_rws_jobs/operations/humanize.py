"""Words for people: unix-second times as "in 3 min" / "2 h ago", and cron expressions in plain words.

The admin uses these; they take ``now`` as a parameter so tests need no clock.
"""

from __future__ import annotations

import datetime as dt
import re

from ..schedules import cron

_MINUTE, _HOUR, _DAY, _YEAR = 60, 3600, 86400, 365.25 * 86400


def _half_up(x: float) -> int:
    # round() rounds half to even, which would turn 90 s into "2 min" but 150 s into "2 min" too.
    return int(x + 0.5)


#: (unit, name, sub-unit, its name): a length is shown in the largest unit it reaches, with the
#: sub-unit below 10 units ("1 h 20 min"); minutes are whole, seconds do not matter past one.
_TIERS = ((_MINUTE, "min", _MINUTE, "s"), (_HOUR, "h", _MINUTE, "min"), (_DAY, "d", _HOUR, "h"))


def duration(seconds: float) -> str:
    """A length of time, rounded to what a reader cares about: "45 s", "3 min", "1 h 20 min", "3 d"."""
    s = abs(seconds)
    if s < _MINUTE:
        return f"{int(s)} s"
    for i, (unit, name, sub, sub_name) in enumerate(_TIERS):
        limit = _TIERS[i + 1][0] if i + 1 < len(_TIERS) else 2 * _YEAR
        if s >= limit:
            continue
        big, small = divmod(_half_up(s / sub), unit // sub)
        if big >= 10:  # "12 h 7 min" is more precision than anyone reads
            big, small = _half_up(s / unit), 0
        if big * unit >= limit:  # rounding reached the next unit: "60 min" is "1 h"
            continue
        return f"{big} {name} {small} {sub_name}" if small else f"{big} {name}"
    return f"{_half_up(s / _YEAR)} y"


def relative(ts: int | None, now: int) -> str:
    """Unix second ``ts`` seen from ``now``: "in 3 min", "2 h ago" or "now"; "-" for None."""
    if ts is None:
        return "-"
    delta = int(ts) - int(now)
    if delta == 0:
        return "now"
    return f"in {duration(delta)}" if delta > 0 else f"{duration(delta)} ago"


def absolute(ts: int | None) -> str:
    """Unix second ``ts`` as "2025-01-31 03:00:00 UTC" (cron schedules are UTC too)."""
    if ts is None:
        return "-"
    try:
        return dt.datetime.fromtimestamp(int(ts), dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return f"{ts} (unix seconds)"  # a value no calendar holds; show it rather than fail the page


# ---- cron expressions in words -------------------------------------------------------------

DAY_NAMES = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
MONTH_NAMES = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
_NAME_NUMBERS = {n[:3].lower(): i for i, n in enumerate(DAY_NAMES)}
_MONTH_NUMBERS = {n[:3].lower(): i + 1 for i, n in enumerate(MONTH_NAMES)}
_ALIASES = {
    "@yearly": "0 0 0 1 1 *",
    "@annually": "0 0 0 1 1 *",
    "@monthly": "0 0 0 1 * *",
    "@weekly": "0 0 0 * * 0",
    "@daily": "0 0 0 * * *",
    "@midnight": "0 0 0 * * *",
    "@hourly": "0 0 * * * *",
}
_ITEM = re.compile(r"^(\d+)(?:-(\d+))?$")
_STEP = re.compile(r"^\*/(\d+)$")


class _Complex(Exception):
    """The expression is valid but has no short wording here; the caller shows it as written."""


class _Field:
    """One cron field: ``*`` (any), ``*/n`` (step) or a list of values and ranges."""

    def __init__(self, text: str, names: dict[str, int] | None = None) -> None:
        self.any = text == "*"
        self.step: int | None = None
        self.items: list[tuple[int, int]] = []
        if self.any:
            return
        m = _STEP.match(text)
        if m:
            self.step = int(m.group(1))
            return
        for part in text.split(","):
            if names:
                part = "-".join(str(names.get(p.lower(), p)) for p in part.split("-"))
            m = _ITEM.match(part)
            if not m:
                raise _Complex(text)
            lo = int(m.group(1))
            self.items.append((lo, int(m.group(2)) if m.group(2) else lo))

    @property
    def single(self) -> int | None:
        return self.items[0][0] if len(self.items) == 1 and self.items[0][0] == self.items[0][1] else None

    def values(self) -> list[int]:
        """The listed numbers; _Complex if any item is a range."""
        if self.any or self.step is not None or any(lo != hi for lo, hi in self.items):
            raise _Complex("not a list of values")
        return [lo for lo, _ in self.items]


def _join(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _every(n: int, unit: str) -> str:
    return f"every {unit}" if n == 1 else f"every {n} {unit}s"


def _named(f: _Field, names: tuple[str, ...], offset: int = 0) -> str:
    def name(i: int) -> str:
        if not 0 <= i - offset < len(names) + (1 if names is DAY_NAMES else 0):
            raise _Complex("out of range")
        return names[(i - offset) % len(names)]  # day-of-week 7 is Sunday too

    return _join([name(lo) if lo == hi else f"{name(lo)} to {name(hi)}" for lo, hi in f.items])


def _time_of_day(sec: _Field, minute: _Field, hour: _Field) -> str:
    """The part of a day on which it fires: "at 03:00:00 UTC", "every 15 minutes", ..."""
    if not hour.any and hour.step is None and minute.single is not None and sec.single is not None:
        times = [f"{h:02d}:{minute.single:02d}:{sec.single:02d}" for h in hour.values()]
        if len(times) <= 4:
            return f"at {_join(times)} UTC"
        raise _Complex("too many times")
    if hour.step is not None and minute.single == 0 and sec.single == 0:
        return _every(hour.step, "hour")
    within_hour = _within_hour(sec, minute)
    if hour.any:
        return within_hour
    if len(hour.items) == 1 and hour.step is None:
        lo, hi = hour.items[0]
        return f"{within_hour}, from {lo:02d}:00 to {hi:02d}:59 UTC"
    raise _Complex("hours")


def _within_hour(sec: _Field, minute: _Field) -> str:
    if minute.any:
        if sec.any:
            return "every second"
        if sec.step is not None:
            return _every(sec.step, "second")
        if sec.single == 0:
            return "every minute"
        return f"every minute at second {_join([str(s) for s in sec.values()])}"
    if minute.step is not None and sec.single is not None:
        at = f" at second {sec.single}" if sec.single else ""
        return _every(minute.step, "minute") + at
    if sec.single is not None:
        minutes = minute.values()
        if minutes == [0] and sec.single == 0:
            return "every hour, on the hour"
        at = f", second {sec.single}" if sec.single else ""
        word = "minute" if len(minutes) == 1 else "minutes"
        return f"every hour at {word} {_join([str(m) for m in minutes])}{at}"
    raise _Complex("seconds and minutes")


def _days(dom: _Field, month: _Field, dow: _Field) -> str:
    if dom.step is not None or month.step is not None or dow.step is not None:
        raise _Complex("steps in days")
    weekdays = "" if dow.any else _named(dow, DAY_NAMES)
    if dom.any and month.any:
        return f"on {weekdays}" if weekdays else "every day"
    months = "every month" if month.any else _named(month, MONTH_NAMES, offset=1)
    if dom.any:
        text = f"every day in {months}"
    else:
        days = _join([str(lo) if lo == hi else f"{lo} to {hi}" for lo, hi in dom.items])
        if dom.single is not None and not month.any and month.single is not None:
            text = f"on {dom.single} {months}"
        else:
            text = f"on day{'s' if dom.single is None else ''} {days} of {months}"
    # Both fields must match (not classic cron's either-or): say so in words.
    return f"{text}, if it is a {weekdays}" if weekdays else text


def describe_cron(expr: str) -> str:
    """A cron expression in plain words ("every 15 seconds", "at 03:00:00 UTC every day").

    Falls back to the expression as written when it is invalid or has no short wording.
    """
    try:
        text = cron.validate(expr)
    except cron.CronError:
        return str(expr)
    fields = _ALIASES.get(text.lower(), text).split(" ")
    if len(fields) == 5:
        fields.insert(0, "0")
    try:
        sec, minute, hour, dom = (_Field(f) for f in fields[:4])
        month = _Field(fields[4], _MONTH_NUMBERS)
        dow = _Field(fields[5], _NAME_NUMBERS)
        when = _time_of_day(sec, minute, hour)
        days = _days(dom, month, dow)
    except _Complex:
        return text
    if when.startswith("at "):
        return f"{when} {days}"
    return when if days == "every day" else f"{when}, {days}"
