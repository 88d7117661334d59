"""Oban for Python on PostgreSQL (RWS_BENCH_OBAN_DSN): ``enqueue(N)`` enqueues N Stamp jobs, one
call each, each its own transaction (run it from another module: a worker is named by its
module); ``oban start --queues
default:4`` drains them."""

import asyncio
import os

from oban import Oban, worker

from benchmarks.peerapps.stamps import stamp


@worker(queue="default")
class Stamp:
    async def process(self, job):
        stamp()


def enqueue(n: int) -> None:
    asyncio.run(_enqueue(n))


async def _enqueue(n: int) -> None:
    from psycopg_pool import AsyncConnectionPool

    async with AsyncConnectionPool(
        os.environ["RWS_BENCH_OBAN_DSN"], min_size=1, max_size=1, open=False
    ) as pool:
        Oban(pool=pool)  # client mode: no queues
        for _ in range(n):
            await Stamp.enqueue({})
