from django.db import models


class Pickup(models.Model):
    """Seconds from enqueue to the handler starting, written by the latency handler."""

    latency = models.FloatField()
