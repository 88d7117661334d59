import time

from django_rws_jobs import job


@job("bench.noop")
def noop(payload: str) -> None:
    pass


@job("bench.latency")
def latency(payload: str) -> None:
    from .models import Pickup

    Pickup.objects.create(latency=time.time() - float(payload))
