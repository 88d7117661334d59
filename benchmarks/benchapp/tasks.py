"""The django.tasks task of the tasks drain (benchmarks/run.py)."""

from django.tasks import task


@task
def noop() -> None:
    pass


@task
def stamp() -> None:
    """The W1 drain's task beside the django.tasks peers (benchmarks/peers.py tasks)."""
    from benchmarks.peerapps.stamps import stamp as _stamp

    _stamp()
