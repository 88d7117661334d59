from django.db import models


class Pickup(models.Model):
    """When the latency handler started job number ``seq`` (unix seconds)."""

    seq = models.IntegerField()
    started = models.FloatField()


class Row(models.Model):
    """A row a long job's loop reads (benchmarks/iterate.py)."""

    n = models.IntegerField()
