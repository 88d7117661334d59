"""The benchmarks' PostgreSQL server as a Django DATABASES entry: one for ours
(benchmarks/settings.py) and the Django-based peers (peerapps/django_settings.py)."""

from typing import Any


def postgres(name: str, port: str = "5432", **extra: Any) -> dict[str, Any]:
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": "postgres",
        "HOST": "127.0.0.1",
        "PORT": port,
        **extra,
    }
