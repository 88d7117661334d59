"""The django.tasks task of the tasks drain (benchmarks/run.py)."""

from django.tasks import task


@task
def noop() -> None:
    pass
