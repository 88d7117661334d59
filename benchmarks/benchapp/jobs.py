import time

from django_rws_jobs import job


@job("bench.noop")
def noop(payload: str) -> None:
    pass


@job("bench.latency")
def latency(payload: str) -> None:
    from .models import Pickup

    started = time.time()
    Pickup.objects.create(seq=int(payload), started=started)
