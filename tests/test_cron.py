"""The cron grammar: due times computed by hand, and each malformed expression's message."""

import calendar
import datetime as dt
import random

import pytest

from django_rws_jobs.schedules.cron import CronError, CronNeverFires, next_after, parse, validate


def ts(text: str) -> int:
    return calendar.timegm(dt.datetime.fromisoformat(text).timetuple())


def iso(t: int) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S %a")


def following(expr: str, start: str, n: int = 1) -> list[str]:
    out, t = [], ts(start)
    for _ in range(n):
        t = next_after(expr, t)
        out.append(iso(t))
    return out


@pytest.mark.parametrize(
    "expr, start, expected",
    [
        # Feb 29: only in leap years, and 2100 is not one.
        ("0 0 0 29 2 *", "2024-03-01 00:00:00", ["2028-02-29 00:00:00 Tue", "2032-02-29 00:00:00 Sun"]),
        ("0 0 0 29 2 *", "2097-01-01 00:00:00", ["2104-02-29 00:00:00 Fri"]),
        # Day 31: months without one are skipped; a due time is never its own next one.
        ("0 30 12 31 * *", "2024-04-01 00:00:00", ["2024-05-31 12:30:00 Fri", "2024-07-31 12:30:00 Wed"]),
        ("0 30 12 31 * *", "2024-01-31 12:30:00", ["2024-03-31 12:30:00 Sun"]),
        # Friday the 13th: day-of-month AND day-of-week (classic cron's OR would say 2024-01-05).
        (
            "0 0 0 13 * 5",
            "2024-01-01 00:00:00",
            ["2024-09-13 00:00:00 Fri", "2024-12-13 00:00:00 Fri", "2025-06-13 00:00:00 Fri"],
        ),
        ("0 0 0 13 * fri", "2024-09-13 00:00:00", ["2024-12-13 00:00:00 Fri"]),
        # Feb 29 on a Monday: 28 years apart, then 40 across 2100.
        (
            "0 0 0 29 2 1",
            "2024-01-01 00:00:00",
            ["2044-02-29 00:00:00 Mon", "2072-02-29 00:00:00 Mon", "2112-02-29 00:00:00 Mon"],
        ),
        # Every 15 seconds.
        (
            "*/15 * * * * *",
            "2024-01-01 12:00:00",
            [
                "2024-01-01 12:00:15 Mon",
                "2024-01-01 12:00:30 Mon",
                "2024-01-01 12:00:45 Mon",
                "2024-01-01 12:01:00 Mon",
            ],
        ),
        ("*/15 * * * * *", "2024-01-01 12:00:14", ["2024-01-01 12:00:15 Mon"]),
        ("*/15 * * * * *", "2024-12-31 23:59:59", ["2025-01-01 00:00:00 Wed"]),
        # Weekdays, on the hour from 9 to 17.
        ("0 0 9-17 * * 1-5", "2024-01-05 16:00:00", ["2024-01-05 17:00:00 Fri", "2024-01-08 09:00:00 Mon"]),
        ("0 0 9-17 * * 1-5", "2024-01-08 08:59:59", ["2024-01-08 09:00:00 Mon"]),
        ("0 0 9-17 * * mon-fri", "2024-01-06 10:00:00", ["2024-01-08 09:00:00 Mon"]),
        # Lists and single values in every field.
        (
            "5,10 0 3 1,15 1,7 *",
            "2024-01-01 03:00:05",
            ["2024-01-01 03:00:10 Mon", "2024-01-15 03:00:05 Mon"],
        ),
        ("0 0 3 * * *", "2024-01-01 03:00:00", ["2024-01-02 03:00:00 Tue"]),
        # Extensions: N-M/S, 7 = Sunday, names, five fields, aliases.
        (
            "0 10-50/20 * * * *",
            "2024-01-01 00:00:00",
            [
                "2024-01-01 00:10:00 Mon",
                "2024-01-01 00:30:00 Mon",
                "2024-01-01 00:50:00 Mon",
                "2024-01-01 01:10:00 Mon",
            ],
        ),
        ("0 0 0 * * 7", "2024-01-01 00:00:00", ["2024-01-07 00:00:00 Sun"]),
        ("0 0 0 * * 0", "2024-01-01 00:00:00", ["2024-01-07 00:00:00 Sun"]),
        ("0 0 0 1 JAN,jul *", "2024-02-01 00:00:00", ["2024-07-01 00:00:00 Mon", "2025-01-01 00:00:00 Wed"]),
        ("30 9 * * 1", "2024-01-01 09:30:00", ["2024-01-08 09:30:00 Mon"]),
        ("*/20 * * * *", "2024-01-01 00:00:00", ["2024-01-01 00:20:00 Mon"]),
        ("@hourly", "2024-01-01 00:59:59", ["2024-01-01 01:00:00 Mon"]),
        ("@daily", "2024-01-01 00:00:00", ["2024-01-02 00:00:00 Tue"]),
        ("@midnight", "2024-01-01 00:00:00", ["2024-01-02 00:00:00 Tue"]),
        ("@weekly", "2024-01-01 00:00:00", ["2024-01-07 00:00:00 Sun"]),
        ("@monthly", "2024-01-15 00:00:00", ["2024-02-01 00:00:00 Thu"]),
        ("@yearly", "2024-01-01 00:00:00", ["2025-01-01 00:00:00 Wed"]),
        ("@annually", "2024-01-01 00:00:00", ["2025-01-01 00:00:00 Wed"]),
    ],
)
def test_due_times(expr, start, expected):
    assert following(expr, start, len(expected)) == expected


def test_whitespace_is_normalised_and_text_kept_as_written():
    assert validate("  0  0 3 *\t* *  ") == "0 0 3 * * *"
    assert validate("@Daily") == "@Daily"
    assert next_after("@Daily", ts("2024-01-01 00:00:00")) == ts("2024-01-02 00:00:00")


def test_every_second():
    assert following("* * * * * *", "2024-01-01 00:00:00", 2) == [
        "2024-01-01 00:00:01 Mon",
        "2024-01-01 00:00:02 Mon",
    ]
    assert following("*/1 * * * * *", "2024-01-01 00:00:59") == ["2024-01-01 00:01:00 Mon"]


@pytest.mark.parametrize(
    "expr, message",
    [
        (
            "* * * *",
            "cron expression '* * * *' has 4 fields; it needs 6 "
            "(second minute hour day-of-month month day-of-week), or 5 without the second",
        ),
        (
            "* * * * * * 2030",
            "cron expression '* * * * * * 2030' has 7 fields; it needs 6 "
            "(second minute hour day-of-month month day-of-week), or 5 without the second",
        ),
        ("60 * * * * *", "cron expression '60 * * * * *': second 60 is out of range 0-59"),
        ("* 60 * * * *", "cron expression '* 60 * * * *': minute 60 is out of range 0-59"),
        ("0 0 24 * * *", "cron expression '0 0 24 * * *': hour 24 is out of range 0-23"),
        ("0 0 0 0 * *", "cron expression '0 0 0 0 * *': day-of-month 0 is out of range 1-31"),
        ("0 0 0 32 * *", "cron expression '0 0 0 32 * *': day-of-month 32 is out of range 1-31"),
        ("0 0 0 1 13 *", "cron expression '0 0 0 1 13 *': month 13 is out of range 1-12"),
        ("0 0 0 1 0 *", "cron expression '0 0 0 1 0 *': month 0 is out of range 1-12"),
        ("0 0 0 * * 8", "cron expression '0 0 0 * * 8': day-of-week 8 is out of range 0-7 (7 is Sunday too)"),
        (
            "0 0 0 * * 1-8",
            "cron expression '0 0 0 * * 1-8': day-of-week 8 is out of range 0-7 (7 is Sunday too)",
        ),
        ("*/0 * * * * *", "cron expression '*/0 * * * * *': the second step in '*/0' must be at least 1"),
        ("0 0 1-5/0 * * *", "cron expression '0 0 1-5/0 * * *': the hour step in '1-5/0' must be at least 1"),
        (
            "0 0 17-9 * * *",
            "cron expression '0 0 17-9 * * *': the hour range '17-9' is reversed; "
            "write it low-high (two ranges to wrap around)",
        ),
        (
            "0 0 0 * * 5-1",
            "cron expression '0 0 0 * * 5-1': the day-of-week range '5-1' is reversed; "
            "write it low-high (two ranges to wrap around)",
        ),
        (
            "5/15 * * * * *",
            "cron expression '5/15 * * * * *': cannot read the second field '5/15'; "
            "each comma-separated item must be *, N, N-M, */S or N-M/S",
        ),
        (
            "1,,2 * * * * *",
            "cron expression '1,,2 * * * * *': cannot read the second field '1,,2'; "
            "each comma-separated item must be *, N, N-M, */S or N-M/S",
        ),
        (
            "0 0 0 ? * *",
            "cron expression '0 0 0 ? * *': cannot read the day-of-month field '?'; "
            "each comma-separated item must be *, N, N-M, */S or N-M/S",
        ),
        (
            "0 0 0 * * 5#2",
            "cron expression '0 0 0 * * 5#2': cannot read the day-of-week field '5#2'; "
            "each comma-separated item must be *, N, N-M, */S or N-M/S (sun-sat work too)",
        ),
        ("0 0 0 L * *", "cron expression '0 0 0 L * *': 'L' is not a valid day-of-month"),
        ("0 0 0 * * funday", "cron expression '0 0 0 * * funday': 'funday' is not a valid day-of-week"),
        ("mon * * * * *", "cron expression 'mon * * * * *': 'mon' is not a valid second"),
        ("0 0 0 * jan-mon *", "cron expression '0 0 0 * jan-mon *': 'mon' is not a valid month"),
        (
            "@reboot",
            "cron expression '@reboot' is not a known alias; "
            "use one of @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly",
        ),
        (
            "@daily 5",
            "cron expression '@daily 5' is not a known alias; "
            "use one of @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly",
        ),
        ("", "cron expression '' is empty"),
        ("  ", "cron expression '  ' is empty"),
        (None, "cron expression None must be a string, not NoneType"),
        (5, "cron expression 5 must be a string, not int"),
        (["* * * * * *"], "cron expression ['* * * * * *'] must be a string, not list"),
        (
            "* " * 200,
            "cron expression '* * * * * * * * * * * * * * * * * * * * ...' is 399 characters; "
            "the limit is 255",
        ),
    ],
)
def test_malformed(expr, message):
    with pytest.raises(CronError) as info:
        parse(expr)
    assert str(info.value) == message
    assert not isinstance(info.value, CronNeverFires)


@pytest.mark.parametrize(
    "expr, message",
    [
        (
            "0 0 0 30 2 *",
            "cron expression '0 0 0 30 2 *' never fires: day-of-month '30' never occurs in month '2'",
        ),
        (
            "0 0 0 31 4,6,9,11 *",
            "cron expression '0 0 0 31 4,6,9,11 *' never fires: "
            "day-of-month '31' never occurs in month '4,6,9,11'",
        ),
        (
            "0 0 30-31 feb *",
            "cron expression '0 0 30-31 feb *' never fires: day-of-month '30-31' never occurs in month 'feb'",
        ),
    ],
)
def test_never_fires(expr, message):
    with pytest.raises(CronNeverFires) as info:
        parse(expr)
    assert str(info.value) == message


def test_rare_but_possible_days_are_not_never_firing():
    parse("0 0 0 29 2 *")
    parse("0 0 0 30,31 2,4 *")  # April 30
    parse("0 0 0 31 1-12/2 sat")


# -- croniter against a brute-force reading of the grammar -----------------------------------------


def _reference_next(cron, t):
    """The first second after ``t`` that the sets match: day by day, then the time of day."""
    start = dt.datetime.fromtimestamp(t + 1, dt.timezone.utc)
    day = start.date()
    times = sorted((h, m, s) for h in cron.hour for m in cron.minute for s in cron.second)
    for _ in range(400 * 366):
        if day.month in cron.month and day.day in cron.day and (day.weekday() + 1) % 7 in cron.weekday:
            floor = (start.hour, start.minute, start.second) if day == start.date() else (0, 0, 0)
            for hms in times:
                if hms >= floor:
                    return calendar.timegm((day.year, day.month, day.day, *hms, 0, 0, 0))
        day += dt.timedelta(days=1)
    raise AssertionError("no due time within 400 years")


def _random_field(rng, lo, hi):
    def item():
        kind = rng.choice(["*", "*/S", "N", "N", "N-M", "N-M/S"])
        a, b = sorted(rng.randint(lo, hi) for _ in range(2))
        return {
            "*": "*",
            "*/S": f"*/{rng.randint(1, hi + 1)}",
            "N": str(a),
            "N-M": f"{a}-{b}",
            "N-M/S": f"{a}-{b}/{rng.randint(1, 5)}",
        }[kind]

    return ",".join(item() for _ in range(rng.choice([1, 1, 2, 3])))


def test_croniter_agrees_with_the_grammar_on_random_expressions():
    rng = random.Random(20240229)
    bounds = [(0, 59), (0, 59), (0, 23), (1, 31), (1, 12), (0, 7)]
    checked = 0
    while checked < 400:
        expr = " ".join(_random_field(rng, lo, hi) for lo, hi in bounds)
        try:
            cron = parse(expr)
        except CronNeverFires:
            continue
        t = rng.randint(ts("1999-01-01 00:00:00"), ts("2101-01-01 00:00:00"))
        if rng.random() < 0.3:
            t = cron.next_after(t)  # start exactly on a due time
        got = cron.next_after(t)
        assert got == _reference_next(cron, t), (expr, iso(t), iso(got))
        assert cron.matches(got) and got > t
        checked += 1
