from procrastinate.contrib.django import app

from benchmarks.peerapps.stamps import stamp as _stamp


@app.task(queue="default")
def stamp() -> None:
    _stamp()


def enqueue(n: int) -> None:
    for _ in range(n):
        stamp.defer()
