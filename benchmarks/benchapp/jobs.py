import time

from benchmarks.peerapps.stamps import stamp as write_stamp
from django_rws_jobs import job


@job("bench.noop")
def noop(payload: str) -> None:
    pass


@job("bench.latency")
def latency(payload: str) -> None:
    from .models import Pickup

    started = time.time()
    Pickup.objects.create(seq=int(payload), started=started)


def cpu_work(iterations: int) -> int:
    """Pure Python arithmetic: it holds the GIL throughout."""
    total = 0
    for i in range(iterations):
        total += i * i % 7
    return total


@job("bench.cpu")
def cpu(payload: str) -> None:
    cpu_work(int(payload))


@job("bench.stamp")
def stamp(payload: str) -> None:
    write_stamp()


def _rows(payload: str, report: bool) -> None:
    """A handler's loop over ``payload`` rows, each a little work (a row made into JSON); with
    ``report``, a progress() call per row."""
    import json

    from django_rws_jobs import current_job

    rows = int(payload)
    job = current_job() if report else None
    for i in range(rows):
        json.dumps({"row": i, "name": "item"})
        if job is not None:
            job.progress(i + 1, rows)


@job("bench.rows")
def rows(payload: str) -> None:
    _rows(payload, report=False)


@job("bench.rows_progress")
def rows_progress(payload: str) -> None:
    _rows(payload, report=True)


@job("bench.snooze")
def snooze(payload: str) -> None:
    from django_rws_jobs import Snooze

    raise Snooze(3600)


@job("bench.fail")
def fail(payload: str) -> None:
    raise ValueError("bench")


#: What the loop handlers measured: (label, CPU seconds of the loop, items).
LOOPS: list[tuple[str, float, int]] = []


def _numbers(count: int):
    def numbers(cursor):
        for i in range(0 if cursor is None else cursor, count):
            yield i + 1, i

    return numbers


@job("bench.loop")
def loop(payload: str) -> None:
    """Payload "<kind> <count>": a loop whose body does nothing, over the benchmark's rows or a
    function's numbers, plain or through current_job().iterate (benchmarks/iterate.py)."""
    import time

    from django_rws_jobs import current_job

    from .models import Row

    kind, count = payload.split()
    n = int(count)
    rows = Row.objects.order_by("pk")
    started = time.process_time()
    items = 0
    if kind == "rows_plain":
        for _row in rows.iterator(chunk_size=500):
            items += 1
    elif kind == "rows_iterate":
        for _row in current_job().iterate(rows):
            items += 1
    elif kind == "numbers_plain":
        for _cursor, _i in _numbers(n)(None):
            items += 1
    elif kind == "numbers_iterate":
        for _i in current_job().iterate(_numbers(n)):
            items += 1
    LOOPS.append((kind, time.process_time() - started, items))
