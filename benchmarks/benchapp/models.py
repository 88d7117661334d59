from django.db import models


class Pickup(models.Model):
    """When the latency handler started job number ``seq`` (unix seconds)."""

    seq = models.IntegerField()
    started = models.FloatField()
