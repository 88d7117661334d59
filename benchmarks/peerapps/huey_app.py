"""Huey with its SQLite storage (RWS_BENCH_HUEY_DB): ``enqueue(N)`` enqueues N stamp tasks, one
call each (run it from another module: tasks enqueued from ``__main__`` are named after it);
``huey_consumer benchmarks.peerapps.huey_app.huey -w 4 -k thread`` drains them."""

import os

from huey import SqliteHuey

from benchmarks.peerapps.stamps import stamp as _stamp

huey = SqliteHuey("bench", filename=os.environ["RWS_BENCH_HUEY_DB"])


@huey.task()
def stamp() -> None:
    _stamp()


def enqueue(n: int) -> None:
    for _ in range(n):
        stamp()
