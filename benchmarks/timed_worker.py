"""``python -m benchmarks.timed_worker rws_worker ...``: the worker, with each claim call timed
(benchmarks/snapshot.py). RWS_BENCH_CLAIM_TIMES names the file that gets, at the worker's exit,
one line per claim call: its end on time.time() and its seconds. A claim call on PostgreSQL also
sends the completion of the jobs its dispatcher finished (Store.finish_and_claim), as it does
without the timing."""

from __future__ import annotations

import atexit
import os
import sys
import time
from typing import Any


def main() -> None:
    import django

    django.setup()
    from django_rws_jobs.queue.store import Store

    timings: list[tuple[float, float]] = []
    claim = Store.claim

    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return claim(self, *args, **kwargs)
        finally:
            timings.append((time.time(), time.perf_counter() - t0))

    Store.claim = timed  # type: ignore[method-assign]

    def write() -> None:
        with open(os.environ["RWS_BENCH_CLAIM_TIMES"], "w") as f:
            f.writelines(f"{end:.6f} {seconds:.6f}\n" for end, seconds in timings)

    atexit.register(write)
    from django.core.management import execute_from_command_line

    execute_from_command_line([sys.argv[0], *sys.argv[1:]])


if __name__ == "__main__":
    main()
