"""What a value must be before it reaches the database: text, integers, queue names, job ids, due times.

A value of the wrong type raises TypeError, a value out of bounds ValueError; both name the value
and the limit. Only the standard library here: ``registry`` (imported before Django is set up)
checks ``@job`` options with these too.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Iterable
from typing import Any

QUEUE_MAX = 64
UNIQUE_MAX = 191
#: A concurrency key's length, and the most jobs of one key that may run at once.
KEY_MAX = 191
CONCURRENCY_MAX = 100_000
ID_MAX = 64
INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # Unicode category Cc


def show(value: Any, n: int = 40) -> str:
    """``value`` for an error message: a long text cut short, a huge integer by its size."""
    if isinstance(value, str):
        return repr(value if len(value) <= n else value[:n] + "...")
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        # str() of a big enough int raises (sys.set_int_max_str_digits); its size says enough
        return f"{'-' if value < 0 else ''}(a {value.bit_length()}-bit integer)"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def text(name: str, value: Any, *, limit: int | None = None, empty: bool = False) -> str:
    """``value`` if it is text every supported database stores exactly."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__} {show(value)}")
    if not empty and not value:
        raise ValueError(f"{name} must not be empty")
    if limit is not None and len(value) > limit:
        raise ValueError(f"{name} {show(value)} is {len(value)} characters; the limit is {limit}")
    if "\x00" in value:
        raise ValueError(f"{name} {show(value)} contains a NUL character, which PostgreSQL cannot store")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{name} {show(value)} is not valid Unicode text: {exc.reason}") from None
    return value


def integer(name: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {show(value)}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} {show(value)} is out of range; it must be between {lo} and {hi}")
    return value


#: The longest time limit a job may have: a week, as LEASE_SECONDS.
TIMEOUT_MAX = 7 * 86400


def concurrency_limit(value: Any, name: str = "concurrency_limit") -> int:
    return integer(name, value, 1, CONCURRENCY_MAX)


def timeout(value: Any, name: str = "timeout") -> float | None:
    """None (no limit of its own) or a job's time limit in seconds: a finite number above 0 and at
    most TIMEOUT_MAX. (tests/test_timeouts.py::test_bad_timeouts_are_refused_naming_the_value)"""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__} {show(value)}")
    if not (isinstance(value, int) or math.isfinite(value)) or not 0 < value <= TIMEOUT_MAX:
        raise ValueError(
            f"{name} {show(value)} is out of range; it must be above 0 and at most {TIMEOUT_MAX} s"
        )
    return float(value)


def queue_name(value: Any, name: str = "queue name") -> str:
    """A queue name that ``rws_worker --queues a,b`` can select: 1 to 64 characters, no comma,
    no whitespace at either end (the option's list is split at commas and stripped) and no
    control characters. (tests/test_input.py::test_queue_names_that_queues_cannot_select_are_refused)"""
    value = text(name, value, limit=QUEUE_MAX)
    if "," in value:
        raise ValueError(f"{name} {show(value)} contains a comma; rws_worker --queues could not select it")
    if value != value.strip():
        raise ValueError(
            f"{name} {show(value)} starts or ends with whitespace; rws_worker --queues could not select it"
        )
    if _CONTROL.search(value):
        raise ValueError(f"{name} {show(value)} contains a control character")
    return value


def queue_list(queues: Any, name: str = "queues") -> list[str] | None:
    """None (every queue) or a non-empty list of queue names; a bare str is a TypeError, not
    its characters. (tests/test_input.py::test_a_queue_list_must_be_a_list_of_names)"""
    if queues is None:
        return None
    if isinstance(queues, (str, bytes, bytearray, dict)):
        raise TypeError(
            f"{name} must be a list of queue names, got {type(queues).__name__} {show(queues)}"
            + (f"; for one queue write [{show(queues)}]" if isinstance(queues, str) else "")
        )
    try:
        names = list(queues)
    except TypeError:
        raise TypeError(
            f"{name} must be a list of queue names, got {type(queues).__name__} {show(queues)}"
        ) from None
    if not names:
        raise ValueError(f"{name} is empty; pass None to take jobs from every queue")
    return [queue_name(q) for q in names]


def job_id(value: Any) -> str:
    """A job id to look up: text a database can hold. Any other id of any length may simply not
    exist. (tests/test_input.py::test_retry_and_delete_give_the_same_answer_on_every_database)"""
    return text("job id", value, empty=True)


def only_known(name: str, value: Any, known: Iterable[str]) -> None:
    """Raise TypeError for each key of ``value`` (a dict) that is not in ``known``."""
    unknown = [key for key in value if key not in known]
    if unknown:
        raise TypeError(
            f"unknown {name}{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(show(k) for k in unknown)}; the known ones are {', '.join(known)}"
        )


def due_at(run_at: Any, run_in: Any, now: float) -> int:
    """Unix second at which the job becomes due, rounded up so it never runs early."""
    if run_at is not None and run_in is not None:
        raise ValueError("give run_at or run_in, not both")
    if run_at is not None:
        return _run_at_second(run_at)
    if run_in is not None:
        due = math.ceil(now + _delay(run_in))
        if due > INT64_MAX:
            raise ValueError(
                f"run_in {show(run_in)} is too far ahead; the limit is {INT64_MAX - int(now)} seconds"
            )
        return due
    return int(now)


def _run_at_second(run_at: Any) -> int:
    from django.conf import settings  # (Django is set up by the time a job is enqueued)
    from django.utils import timezone

    if not isinstance(run_at, dt.datetime):
        raise TypeError(f"run_at must be a datetime, got {type(run_at).__name__} {show(run_at)}")
    if timezone.is_naive(run_at):
        if settings.USE_TZ:
            raise ValueError(
                f"run_at {run_at.isoformat()} is a naive datetime while USE_TZ is on; "
                "pass an aware one (django.utils.timezone.now() + ...)"
            )
        run_at = timezone.make_aware(run_at, timezone.get_default_timezone())
    return max(math.ceil(run_at.timestamp()), 0)


def _delay(run_in: Any) -> float:
    """``run_in`` in seconds: finite and not negative. An int too big for a float is clamped
    first, so that it gets the errors of its sign ("too far ahead", "non-negative"), not an
    OverflowError.
    (tests/test_input.py::test_huge_delays_are_a_value_error_naming_the_limit)"""
    if isinstance(run_in, dt.timedelta):
        seconds = run_in.total_seconds()
    elif isinstance(run_in, int) and not isinstance(run_in, bool):
        seconds = float(max(min(run_in, 2**64), -1))
    elif isinstance(run_in, float):
        seconds = run_in
    else:
        raise TypeError(f"run_in must be a timedelta or seconds, got {type(run_in).__name__} {show(run_in)}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"run_in {show(run_in)} must be a finite, non-negative delay")
    return seconds


def json_dict(name: str, value: Any, limit: int, setting: str) -> str:
    """``value``, a dict JSON can hold, as compact JSON text of at most ``limit`` bytes (the
    ``setting`` that sets it is named in the error)."""
    if not isinstance(value, dict):
        raise TypeError(f"{name} must be a dict, got {type(value).__name__} {show(value)}")
    try:
        dumped = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be JSON: {exc}") from None
    size = len(dumped.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise ValueError(f"{name} is {size} bytes of JSON; the limit is {limit} ({setting})")
    json_without_nul(name, value, dumped)
    return text(name, dumped)


#: A NUL as ``json.dumps`` writes it: ``\u0000`` after an even number of backslashes (an odd one
#: makes it the text "\u0000", whose backslash is escaped).
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def json_without_nul(name: str, value: Any, dumped: str) -> None:
    """ValueError if ``dumped`` (``value`` as JSON) holds a NUL, which PostgreSQL's ``jsonb``
    refuses: refused on every database alike, naming the text that holds it
    (tests/test_input.py::test_a_nul_in_any_json_value_is_refused_on_every_database)."""
    if "\\u0000" not in dumped or not _JSON_NUL.search(dumped):
        return
    found = _text_with_nul(value)
    raise ValueError(
        f"{name} holds the text {show(found)}, which contains a NUL character; PostgreSQL cannot store it"
    )


def _text_with_nul(value: Any) -> str | None:
    """The first key or string in ``value`` (JSON) that contains a NUL."""
    if isinstance(value, str):
        return value if "\x00" in value else None
    items: Iterable[Any] = ()
    if isinstance(value, dict):
        items = (part for pair in value.items() for part in pair)
    elif isinstance(value, (list, tuple)):
        items = value
    for item in items:
        found = _text_with_nul(item)
        if found is not None:
            return found
    return None
