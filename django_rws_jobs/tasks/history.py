"""The JSON a task row carries: its payload (what to call) and its history (what happened).

``rws_jobs.payload`` of a task row: ``{"args", "kwargs", "backend", "run_after", "enqueued_at"}``,
and ``"options"`` where ``with_options`` changed the task's own.
``rws_jobs.task_history`` and ``rws_task_results.history``: ``{"errors", "worker_ids",
"started_at", "last_attempted_at", "finished_at"}``, times as unix seconds with their fraction.
Only outcome writes change the history (a claim does not), so what it says survives retries; it
is capped (tests/test_tasks_backend.py::test_the_history_is_capped).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from django.conf import settings
from django.utils import timezone

#: The most errors a history keeps (the latest ones) and the longest traceback of each.
MAX_ERRORS = 10
MAX_TRACEBACK = 8_000
#: The most worker ids a history keeps: TaskResult.attempts counts them, so it is generous.
MAX_WORKER_IDS = 1_000


#: One encoder for every dumps: json.dumps with options makes a new one at each call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def dumps(value: Any) -> str:
    """Compact JSON that every database stores (no NaN, no Infinity)."""
    return _ENCODER.encode(value)


def payload(
    args: Any,
    kwargs: Any,
    backend: str,
    run_after: dt.datetime | None,
    enqueued_at: float,
    options: dict[str, Any] | None = None,
) -> str:
    """``options``: the task's own options that differ from its declaration's (RwsTask's
    ``with_options``), so that get_result gives the task as enqueued."""
    value = {
        "args": args,
        "kwargs": kwargs,
        "backend": backend,
        "run_after": None if run_after is None else run_after.isoformat(),
        "enqueued_at": enqueued_at,
    }
    if options:
        value["options"] = options
    return dumps(value)


def load(text: str | None) -> dict[str, Any]:
    """A payload or a history as a dict; a missing or unreadable one as an empty dict."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def after_attempt(
    history: dict[str, Any],
    worker_id: str | None,
    started: float | None,
    finished: float,
    error: dict[str, str] | None,
) -> dict[str, Any]:
    """The history once an attempt is over (``worker_id`` and ``started`` None: recovery, which
    does not know when the lost attempt started and whose worker id is on the claim)."""
    errors = list(history.get("errors") or [])
    if error is not None:
        errors.append({**error, "traceback": cut(error.get("traceback", ""))})
    worker_ids = list(history.get("worker_ids") or [])
    if worker_id is not None:
        worker_ids.append(worker_id)
    return {
        "errors": errors[-MAX_ERRORS:],
        "worker_ids": worker_ids[-MAX_WORKER_IDS:],
        "started_at": history.get("started_at") or started,
        "last_attempted_at": started if started is not None else history.get("last_attempted_at"),
        "finished_at": finished,
    }


def cut(text: str) -> str:
    """A traceback within MAX_TRACEBACK characters, its first and last lines kept."""
    if len(text) <= MAX_TRACEBACK:
        return text
    keep = MAX_TRACEBACK - 40
    return f"{text[: keep // 4]}\n[... {len(text) - keep} characters cut ...]\n{text[-(keep - keep // 4) :]}"


def when(seconds: float | None) -> dt.datetime | None:
    """Unix seconds as Django's now() gives times: aware in UTC, or naive local without USE_TZ."""
    if seconds is None:
        return None
    value = dt.datetime.fromtimestamp(seconds, tz=dt.timezone.utc)
    return value if settings.USE_TZ else timezone.make_naive(value)


def worker_of(token: str | None) -> str | None:
    """The worker id in a claim token (``<worker id>#<claim number>``)."""
    if not token:
        return None
    return token.rsplit("#", 1)[0]


def load_value(text: str | None) -> Any:
    """A stored return value (JSON)."""
    return None if text is None else json.loads(text)
