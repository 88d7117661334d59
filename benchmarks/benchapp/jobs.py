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
