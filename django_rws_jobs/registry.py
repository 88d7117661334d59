"""Job handlers by job_type: the allow-list of what a worker may run."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable

Handler = Callable[[str], Any]


@dataclass(frozen=True)
class JobSpec:
    """A registered handler and the enqueue defaults declared with it."""

    job_type: str
    func: Handler
    options: dict[str, Any] = field(default_factory=dict)


class Registry:
    def __init__(self) -> None:
        self._specs: dict[str, JobSpec] = {}
        self._lock = threading.Lock()
        # Schedules declared on @job(schedule=...), as settings-style dicts keyed by name.
        self.schedules: dict[str, dict[str, Any]] = {}

    def register(self, job_type: str, func: Handler, **options: Any) -> Handler:
        if not isinstance(job_type, str) or not job_type:
            raise TypeError(f"job_type must be a non-empty string, got {job_type!r}")
        if not callable(func):
            raise TypeError(f"the handler for job_type {job_type!r} must be callable, got {func!r}")
        schedule = options.pop("schedule", None)
        with self._lock:
            existing = self._specs.get(job_type)
            if existing is not None and _unwrap(existing.func) is not _unwrap(func):
                raise ValueError(
                    f"job_type {job_type!r} is already registered to "
                    f"{_name(existing.func)}; cannot register {_name(func)} as well"
                )
            self._specs[job_type] = JobSpec(job_type, func, options)
            if schedule is not None:
                for name, entry in _schedule_entries(job_type, schedule).items():
                    if name in self.schedules and self.schedules[name] != entry:
                        raise ValueError(f"schedule {name!r} is declared twice with different settings")
                    self.schedules[name] = entry
        return func

    def unregister(self, job_type: str) -> None:
        with self._lock:
            self._specs.pop(job_type, None)
            for name in [n for n, e in self.schedules.items() if e["job_type"] == job_type]:
                del self.schedules[name]

    def get(self, job_type: str) -> JobSpec | None:
        return self._specs.get(job_type)

    def __contains__(self, job_type: object) -> bool:
        return job_type in self._specs

    def job_types(self) -> list[str]:
        return sorted(self._specs)


def _schedule_entries(job_type: str, schedule: Any) -> dict[str, dict[str, Any]]:
    """Normalise ``schedule=`` ("cron", {"name":..., "cron":...}, or a list of them)."""
    items = schedule if isinstance(schedule, (list, tuple)) else [schedule]
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        entry = {"cron": item} if isinstance(item, str) else dict(item)
        entry.setdefault("job_type", job_type)
        name = entry.pop("name", None) or job_type
        if name in out:
            raise ValueError(f"schedule {name!r} is declared twice on job_type {job_type!r}")
        out[name] = entry
    return out


def _unwrap(func: Handler) -> Any:
    return getattr(func, "__wrapped__", func)


def _name(func: Handler) -> str:
    return f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', repr(func))}"


registry = Registry()


def register(job_type: str, func: Handler, **options: Any) -> Handler:
    """Register ``func`` as the handler of ``job_type``; a second, different function raises."""
    return registry.register(job_type, func, **options)


def job(job_type: str, **options: Any) -> Callable[[Handler], Handler]:
    """Decorate a function ``f(payload: str)`` as the handler of ``job_type``.

    ``queue``, ``priority`` and ``max_retries`` become this type's enqueue defaults;
    ``schedule="0 0 3 * * *"`` (or a dict with ``name``, ``cron``, ``payload`` and options, or a
    list of them) declares a cron schedule that enqueues it.
    """

    def decorator(func: Handler) -> Handler:
        registry.register(job_type, func, **options)
        return func

    return decorator


def autodiscover() -> None:
    """Import the ``jobs`` module of every installed app, as the admin does with ``admin``."""
    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules("jobs")
