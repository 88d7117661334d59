from django.tasks import task

from benchmarks.peerapps.stamps import stamp as _stamp


@task
def stamp() -> None:
    _stamp()


def enqueue(n: int) -> None:
    for _ in range(n):
        stamp.enqueue()
